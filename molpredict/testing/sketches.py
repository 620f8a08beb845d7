"""Conformance checks for sketches (owner: sketches work)."""


def check_sketch(sketch, **kwargs):
    raise NotImplementedError("not implemented yet")
