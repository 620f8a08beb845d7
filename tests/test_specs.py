"""Component spec parsing: values, grids, errors, round-trips."""
import pytest

from molpredict.errors import SpecError
from molpredict.specs import ComponentSpec, Grid, parse_spec, parse_value


def test_parse_name_only():
    assert parse_spec("ppk") == ComponentSpec("ppk", {})


def test_parse_typed_values():
    spec = parse_spec("gaussian-tanimoto:gamma=auto,fp=morgan,radius=2,size=4096,counts=false,p=1e-3,x=none")
    assert spec.name == "gaussian-tanimoto"
    assert spec.params == {"gamma": "auto", "fp": "morgan", "radius": 2, "size": 4096, "counts": False,
                           "p": 0.001, "x": None}
    assert isinstance(spec.params["radius"], int) and isinstance(spec.params["p"], float)


def test_dashes_in_keys_become_underscores():
    assert parse_spec("ppk:mz-sigma=0.01").params == {"mz_sigma": 0.01}


def test_grid_expansion_is_cartesian_in_order():
    spec = parse_spec("sisokr:lam=1e-3|1e-2,m=100|200")
    assert spec.is_grid
    assert spec.params["lam"] == Grid((0.001, 0.01))
    points = [s.params for s in spec.expand()]
    assert points == [{"lam": 0.001, "m": 100}, {"lam": 0.001, "m": 200},
                      {"lam": 0.01, "m": 100}, {"lam": 0.01, "m": 200}]
    assert not any(s.is_grid for s in spec.expand())


@pytest.mark.parametrize("text", ["p-sparsified-rademacher:m=800,p=0.0005", "ppk", "a:b=1|2,c=x", "a:f=0.1"])
def test_str_round_trip(text):
    spec = parse_spec(text)
    assert parse_spec(str(spec)) == spec


def test_float_repr_round_trips_exactly():
    value = 0.1 + 0.2
    assert parse_spec(str(ComponentSpec("k", {"v": value}))).params["v"] == value


@pytest.mark.parametrize("bad", ["", ":m=1", "ppk:m", "ppk:m=1,m=2", "ppk:=3"])
def test_malformed_specs_raise(bad):
    with pytest.raises(SpecError):
        parse_spec(bad)


def test_parse_value_keeps_strings():
    assert parse_value("morgan") == "morgan"
    assert parse_value(" 3 ") == 3


def test_str_writes_each_value_as_given():
    """``p=1e3`` came back as ``p=1000.0``: a parameter the component takes as text then got "1000.0"."""
    spec = parse_spec("k:mode=1e3,tag=007,flag=Yes,note=inf,grid=1e3|none,n=12")
    assert str(spec) == "k:mode=1e3,tag=007,flag=Yes,note=inf,grid=1e3|none,n=12"
    assert [str(point) for point in spec.expand()] == ["k:mode=1e3,tag=007,flag=Yes,note=inf,grid=1e3,n=12",
                                                       "k:mode=1e3,tag=007,flag=Yes,note=inf,grid=none,n=12"]
    assert parse_spec(str(spec)) == spec


def test_str_writes_a_value_that_no_longer_reads_as_its_text_normalised():
    assert str(ComponentSpec("k", {"mode": 5, "x": 0.5}, {"mode": "1e3"})) == "k:mode=5,x=0.5"
    assert str(ComponentSpec("k", {"mode": 1000.0})) == "k:mode=1000.0"  # built from values: as before
