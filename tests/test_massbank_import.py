"""MassBank record import: parsing, filtering, the MGF fields, the structure-disjoint split, archives, fetch."""
from __future__ import annotations

import shutil
import tarfile
import urllib.error
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from molpredict.data import massbank
from molpredict.errors import InputError, ResourceError
from molpredict.data.massbank import import_massbank, parse_record, release_url, split_of

FIXTURES = Path(__file__).parent / "fixtures" / "massbank"

MELLEIN = """BEGIN IONS
TITLE=MSBNK-TEST-AC000001
PEPMASS=179.0697
CHARGE=1+
IONMODE=positive
ADDUCT=[M+H]+
NAME=Mellein
FORMULA=C10H10O3
SMILES=CC1Cc2cccc(O)c2C(=O)O1
INCHIKEY=KWILGNNWGSNMPA-UHFFFAOYSA-N
INSTRUMENT_TYPE=LC-ESI-ITFT
COLLISION_ENERGY=10(NCE)
LICENSE=CC BY-SA
133.065 21905.3
151.075 9239.9
155.974 10980.9
161.06 96508.4
179.07 72563.9
END IONS
"""


def _entries(directory: Path) -> dict[str, str]:
    """TITLE -> MGF entry text, over every output file."""
    out = {}
    for path in sorted(directory.glob("*.mgf")):
        for block in path.read_text().split("BEGIN IONS\n")[1:]:
            title = block.split("\n", 1)[0].removeprefix("TITLE=")
            out[title] = "BEGIN IONS\n" + block.split("END IONS")[0] + "END IONS\n"
    return out


def test_parse_record_fields():
    record = parse_record((FIXTURES / "Contributor_A" / "MSBNK-TEST-AC000001.txt").read_text())
    assert record.accession == "MSBNK-TEST-AC000001"
    assert record.fields["CH$NAME"] == ["Mellein", "3,4-Dihydro-8-hydroxy-3-methylisocoumarin"]
    assert record.first("AC$MASS_SPECTROMETRY ION_MODE") == "POSITIVE"
    assert record.first("MS$FOCUSED_ION PRECURSOR_TYPE") == "[M+H]+"
    assert record.first("CH$LINK INCHIKEY") == "KWILGNNWGSNMPA-UHFFFAOYSA-N"
    # the annotation block's indented lines are not peaks
    assert record.peaks == [("133.065", "21905.3"), ("151.075", "9239.9"), ("155.974", "10980.9"),
                            ("161.06", "96508.4"), ("179.07", "72563.9")]
    with pytest.raises(InputError, match="ACCESSION"):
        parse_record("CH$NAME: x\n//\n", "x.txt")
    with pytest.raises(InputError, match="non-numeric peak"):
        parse_record("ACCESSION: A1\nPK$PEAK: m/z int. rel.int.\n  12.0 abc 1\n//\n", "x.txt")


def test_import_directory(tmp_path):
    summary = import_massbank(FIXTURES, tmp_path)
    assert summary["n_records"] == 8 and summary["n_imported"] == 4
    assert summary["skipped"] == {"MS type MS (only MS2)": 1, "no SMILES": 1, "no precursor m/z": 1,
                                  "SMILES not parsed by RDKit": 1}
    assert sorted(p.name for p in tmp_path.glob("*.mgf")) == sorted(
        f"{s}_{m}.mgf" for s in ("train", "val", "test") for m in ("pos", "neg"))
    entries = _entries(tmp_path)
    assert set(entries) == {"MSBNK-TEST-AC000001", "MSBNK-TEST-AC000002", "MSBNK-TEST-AC000003",
                            "MSBNK-TEST-BC000004"}
    assert entries["MSBNK-TEST-AC000001"] == MELLEIN
    neg = entries["MSBNK-TEST-AC000003"]
    assert "IONMODE=negative\n" in neg and "CHARGE=1-\n" in neg and "ADDUCT=[M-H]-\n" in neg
    assert "SMILES=O=C(O)/C=C/c1ccc(O)c(O)c1\n" in neg and "INCHIKEY=QAIPRVGONGVQAS-DUXPYHPUSA-N\n" in neg
    assert "CHARGE=2+\n" in entries["MSBNK-TEST-BC000004"]
    # structure-disjoint: both Mellein spectra in the same file, the file their first block hashes to
    split = split_of("KWILGNNWGSNMPA")
    text = (tmp_path / f"{split}_pos.mgf").read_text()
    assert "MSBNK-TEST-AC000001" in text and "MSBNK-TEST-AC000002" in text
    assert summary["licenses"] == {"CC BY-SA": 2, "CC BY-NC": 1, "CC BY-NC-SA": 1}


def test_import_archives_equal_directory(tmp_path):
    import_massbank(FIXTURES, tmp_path / "from_dir")
    zpath = tmp_path / "records.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for p in sorted(FIXTURES.rglob("*")):
            if p.is_file():
                z.write(p, "MassBank-data-x/" + str(p.relative_to(FIXTURES)))
    tpath = tmp_path / "records.tar.gz"
    with tarfile.open(tpath, "w:gz") as t:
        t.add(FIXTURES, arcname="MassBank-data-x")
    for archive in (zpath, tpath):
        out = tmp_path / archive.name.split(".")[0]
        import_massbank(archive, out)
        for name in ("train_pos.mgf", "val_pos.mgf", "test_pos.mgf", "train_neg.mgf", "test_neg.mgf"):
            assert (out / name).read_text() == (tmp_path / "from_dir" / name).read_text()


def test_import_output_reads_back(tmp_path):
    from molpredict import io as spectra_mod

    import_massbank(FIXTURES, tmp_path)
    spectra = [s for p in sorted(tmp_path.glob("*.mgf")) if p.stat().st_size for s in spectra_mod.read_spectra(p)]
    by_id = {s.id: s for s in spectra}
    s = by_id["MSBNK-TEST-AC000001"]
    assert s.precursor_mz == pytest.approx(179.0697) and s.ion_mode == "positive" and s.adduct == "[M+H]+"
    assert s.smiles == "CC1Cc2cccc(O)c2C(=O)O1" and s.n_peaks == 5
    assert by_id["MSBNK-TEST-BC000004"].charge == 2


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        import_massbank(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no MassBank record files"):
        import_massbank(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "x.mgf").write_text("BEGIN IONS\n")
    with pytest.raises(InputError, match="expected a directory"):
        import_massbank(tmp_path / "x.mgf", tmp_path / "out")
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(InputError, match="zip"):
        import_massbank(tmp_path / "bad.zip", tmp_path / "out")
    with pytest.raises(InputError, match="sum to 1"):
        import_massbank(FIXTURES, tmp_path / "out", fractions=(("train", 0.5), ("test", 0.2)))


def test_split_hash_fractions_and_stability():
    keys = [f"K{i:013d}" for i in range(20000)]
    counts = Counter(split_of(k) for k in keys)
    assert counts["train"] / 20000 == pytest.approx(0.8, abs=0.015)
    assert counts["val"] / 20000 == pytest.approx(0.1, abs=0.01)
    assert counts["test"] / 20000 == pytest.approx(0.1, abs=0.01)
    # the documented hash, computed independently
    import hashlib
    u = int(hashlib.sha256(b"KWILGNNWGSNMPA").hexdigest()[:16], 16) / 2 ** 64
    assert split_of("KWILGNNWGSNMPA") == ("train" if u < 0.8 else "val" if u < 0.9 else "test")


def test_release_url_and_network_failure(tmp_path, monkeypatch):
    assert release_url("2025.05.1") == \
        "https://github.com/MassBank/MassBank-data/archive/refs/tags/2025.05.1.tar.gz"
    with pytest.raises(InputError):
        release_url("../../evil")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    with pytest.raises(ResourceError) as e:
        massbank.fetch_massbank(tmp_path / "mb", release="2025.05.1", progress=False)
    text = str(e.value)
    assert "\n" not in text and "could not download" in text and "2025.05.1" in text
    assert not list((tmp_path / "mb").glob("*.part"))


def test_cli_data_commands(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from molpredict.cli import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["data", "import-massbank", str(FIXTURES), "-o", str(tmp_path / "mb")])
    assert result.exit_code == 0, result.output
    assert "4 of 8 records imported" in result.stderr and "skipped 1: no SMILES" in result.stderr
    assert (tmp_path / "mb" / "train_pos.mgf").is_file()
    result = runner.invoke(cli, ["data", "import-massbank", str(tmp_path / "missing"), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no such file or directory" in result.stderr

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    result = runner.invoke(cli, ["data", "fetch", "massbank", "-o", str(tmp_path / "f"), "--release", "2025.05.1",
                                 "--no-progress"])
    assert result.exit_code == 5
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("molpredict: error: could not download https://github.com/")


# -- downloads: a local HTTP server serving a tiny release ---------------------------------------------------------

def _tiny_release(tmp_path, every_split: bool = False) -> bytes:
    """The hand-written fixture records as a release archive (``MassBank-data-x/...`` inside a .tar.gz); with
    ``every_split``, plus one positive record (Mellein's, another structure) for each split the fixtures miss."""
    root = tmp_path / "release"
    shutil.copytree(FIXTURES, root / "MassBank-data-x")
    if every_split:
        from molpredict.chem.molecules import Molecule
        template = (FIXTURES / "Contributor_A" / "MSBNK-TEST-AC000001.txt").read_text()
        wanted = {"train", "val", "test"}
        for n in range(2, 60):
            smiles = "C" * n + "O"       # the alcohols: one per split is enough
            split = split_of(Molecule.from_smiles(smiles).inchikey14)
            if split in wanted:
                wanted.discard(split)
                text = template.replace("MSBNK-TEST-AC000001", f"MSBNK-TEST-CC{n:06d}").replace(
                    "CC1CC2=C(C(=CC=C2)O)C(=O)O1", smiles)
                (root / "MassBank-data-x" / f"MSBNK-TEST-CC{n:06d}.txt").write_text(text)
        assert not wanted
    path = tmp_path / "release.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        t.add(root / "MassBank-data-x", arcname="MassBank-data-x")
    return path.read_bytes()


@pytest.fixture
def serve():
    """``serve(payload, cut_first=None, ranges=True) -> (url, range headers seen)``: one file over HTTP on
    127.0.0.1 in a thread; ``cut_first`` bytes only in the first response (then the connection closes);
    ``ranges=False`` ignores Range headers (always 200 with the whole file); ``trickle`` sends a byte every
    ``trickle`` seconds."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    servers = []

    def start(payload: bytes, cut_first: int | None = None, ranges: bool = True, trickle: float | None = None):
        seen: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                header = self.headers.get("Range")
                seen.append(header)
                begin = int(header.split("=")[1].split("-")[0]) if header and ranges else 0
                if begin >= len(payload) and header and ranges:
                    self.send_response(416)
                    self.end_headers()
                    return
                body = payload[begin:]
                self.send_response(206 if begin else 200)
                if begin:
                    self.send_header("Content-Range", f"bytes {begin}-{len(payload) - 1}/{len(payload)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if cut_first is not None and len(seen) == 1:
                    self.wfile.write(body[:cut_first])
                    self.close_connection = True
                    return
                if trickle is not None:  # one byte every `trickle` seconds, for as long as the client reads
                    import time
                    try:
                        for i in range(len(body)):
                            self.wfile.write(body[i:i + 1])
                            self.wfile.flush()
                            time.sleep(trickle)
                    except OSError:
                        pass
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/MassBank-data-x.tar.gz", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_fetch_resumes_an_interrupted_download(tmp_path, serve, capsys):
    payload = _tiny_release(tmp_path)
    url, seen = serve(payload, cut_first=len(payload) // 2)
    out = tmp_path / "mb"
    with pytest.raises(ResourceError) as e:
        massbank.fetch_massbank(out, release="x", url=url, progress=False)
    assert "\n" not in str(e.value) and "to resume" in str(e.value)
    part = out / "MassBank-data-x.tar.gz.part"
    assert part.stat().st_size == len(payload) // 2 and not (out / "MassBank-data-x.tar.gz").exists()
    summary = massbank.fetch_massbank(out, release="x", url=url, progress=True)
    assert seen == [None, f"bytes={len(payload) // 2}-"]
    assert summary["n_imported"] == 4 and summary["url"] == url
    assert not part.exists() and not (out / "MassBank-data-x.tar.gz").exists()
    err = capsys.readouterr().err
    assert "MassBank-data-x.tar.gz" in err and "100%" in err           # the progress bar, resumed at 50%
    import_massbank(FIXTURES, tmp_path / "direct")
    for name in ("train_pos.mgf", "val_pos.mgf", "test_pos.mgf", "train_neg.mgf", "test_neg.mgf"):
        assert (out / name).read_text() == (tmp_path / "direct" / name).read_text()


def test_a_download_that_trickles_stops_instead_of_hanging(tmp_path, serve):
    """A byte now and then resets the socket timeout forever: the download must receive STALL_BYTES every
    ``timeout`` seconds, else it stops (the part kept to resume) with one line."""
    import time

    url, _ = serve(b"x" * 200_000, trickle=0.05)
    t0 = time.monotonic()
    with pytest.raises(ResourceError, match=r"stalled: less than 64 KiB in 0.5 s after \d+ bytes .*to resume"):
        massbank.download(url, tmp_path / "slow.tar.gz", progress=False, timeout=0.5)
    assert time.monotonic() - t0 < 5 and (tmp_path / "slow.tar.gz.part").is_file()


def test_download_restarts_when_the_server_ignores_ranges(tmp_path, serve):
    payload = _tiny_release(tmp_path)
    url, seen = serve(payload, ranges=False)
    target = tmp_path / "a.tar.gz"
    (tmp_path / "a.tar.gz.part").write_bytes(b"stale bytes of something else")
    massbank.download(url, target, progress=False)
    assert seen == ["bytes=29-"] and target.read_bytes() == payload
    # a complete part (the server answers 416 to a range past the end) is taken as the file
    url, seen = serve(payload)
    (tmp_path / "b.tar.gz.part").write_bytes(payload)
    massbank.download(url, tmp_path / "b.tar.gz", progress=False)
    assert seen == [f"bytes={len(payload)}-"] and (tmp_path / "b.tar.gz").read_bytes() == payload


def test_demo_without_data_fetches_and_builds_a_default_library(tmp_path, serve, monkeypatch, capsys):
    """`make demo` on a machine without ../shared: download + import into $MOLPREDICT_HOME/data/massbank, then a
    library of its structures that becomes the default (training is covered in test_end_to_end)."""
    from molpredict import config
    from molpredict.data import demo

    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MOLPREDICT_CONFIG")
    url, seen = serve(_tiny_release(tmp_path, every_split=True))
    data = demo.find_data(None, url=url, release="x", progress=False)
    assert data == tmp_path / "home" / "data" / "massbank" and (data / "train_pos.mgf").is_file()
    assert "downloading MassBank x" in capsys.readouterr().out
    library, described = demo.library_for(data)
    assert len(library) == 6 and "now your default library" in described   # 3 fixture structures, 3 alcohols
    assert config.default_library() == str((data / "library.tsv").resolve())
    # second time: nothing downloaded, the configured library is used
    assert demo.find_data(None, url=url) == data and len(seen) == 1
    assert demo.library_for(data)[1] == str((data / "library.tsv").resolve())
    # a library given to the demo (the Makefile passes one) becomes the default where none is set: the demo's
    # closing suggestion, `molpredict identify my_spectra.mgf`, needs one; a configured default is left alone
    given = tmp_path / "given.tsv"
    library.to_tsv(given)
    assert "now your default library" not in demo.library_for(data, str(given))[1]
    assert config.default_library() == str((data / "library.tsv").resolve())
    config.unset_value("library")
    unusable = tmp_path / "unusable.tsv"
    unusable.write_text("smiles\nnot_a_smiles((\n")
    with pytest.warns(UserWarning), pytest.raises(InputError, match="no usable structure in the library"):
        demo.library_for(data, str(unusable))
    assert config.default_library() is None  # an unusable library never becomes the default
    library_given, described = demo.library_for(data, str(given))
    assert len(library_given) == 6 and "now your default library" in described
    assert config.default_library() == str(given.resolve())


# -- bad input: one-line errors naming the option or file, skip-and-report for records ---------------------------

def _cli(*args):
    from click.testing import CliRunner
    from molpredict.cli import cli

    return CliRunner().invoke(cli, ["data", "import-massbank", *map(str, args), "--no-progress"])


def test_cli_bad_fractions_name_the_option(tmp_path):
    rule = "the fractions must be from 0 to 1 and sum to at most 1"
    for options, message in [
        (["--train-fraction", "nan"], "--train-fraction nan"),
        (["--val-fraction", "inf"], "--val-fraction inf"),
        (["--train-fraction", "1.5"], "--train-fraction 1.5"),
        (["--val-fraction", "-0.1"], "--val-fraction -0.1"),
        (["--train-fraction", "0.8", "--val-fraction", "0.5"],
         "--train-fraction 0.8 and --val-fraction 0.5 leave -0.3 for test"),
    ]:
        result = _cli(FIXTURES, "-o", tmp_path / "out", *options)
        assert result.exit_code == 2, options
        assert result.stderr.strip().splitlines() == [f"molpredict: error: {message}: {rule}"]
        assert not list(tmp_path.rglob("*.mgf"))
    # the bounds are fractions too: 1 - 0.9 - 0.1 is a tiny negative number, taken as 0
    result = _cli(FIXTURES, "-o", tmp_path / "out", "--train-fraction", "0.9", "--val-fraction", "0.1")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "test_pos.mgf").read_text() == ""


@pytest.mark.parametrize("fractions", [(("train", float("nan")), ("val", 0.1), ("test", 0.9)),
                                       (("train", 1.5), ("val", 0.0), ("test", -0.5))])
def test_library_rejects_non_finite_or_out_of_range_fractions(tmp_path, fractions):
    with pytest.raises(InputError, match="each must be a number from 0 to 1") as e:
        import_massbank(FIXTURES, tmp_path / "out", fractions=fractions)
    assert "train=" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def _copy_fixtures(tmp_path) -> Path:
    root = tmp_path / "records"
    shutil.copytree(FIXTURES, root)
    return root


def test_skip_summary_names_the_files(tmp_path):
    root = _copy_fixtures(tmp_path)
    record = root / "Contributor_A" / "MSBNK-TEST-AC000001.txt"
    record.write_text(record.read_text().replace("161.06 96508.4 999", "161.06 abc 999"))
    template = (root / "Contributor_B" / "MSBNK-TEST-BC000001.txt").read_text()   # no SMILES
    for n in range(2, 6):
        (root / "Contributor_B" / f"MSBNK-TEST-BD00000{n}.txt").write_text(
            template.replace("MSBNK-TEST-BC000001", f"MSBNK-TEST-BD00000{n}"))
    result = _cli(root, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert "  skipped 1: no precursor m/z (Contributor_B/MSBNK-TEST-BC000002.txt)" in lines
    assert "  skipped 1: unparsable peak list (Contributor_A/MSBNK-TEST-AC000001.txt: PK$PEAK line 33: " \
           "non-numeric peak '161.06 abc 999')" in lines
    listed = tmp_path / "out" / "skipped.tsv"
    assert f"  skipped 5: no SMILES (Contributor_B/MSBNK-TEST-BC000001.txt, Contributor_B/MSBNK-TEST-BD000002.txt, " \
           f"Contributor_B/MSBNK-TEST-BD000003.txt and 2 more, all in {listed})" in lines
    assert lines[0] == f"molpredict: {root}: 3 of 12 records imported into {tmp_path / 'out'}"
    rows = [line.split("\t") for line in listed.read_text().splitlines()]
    assert rows[0] == ["file", "record", "accession", "reason", "detail"] and len(rows) == 1 + 9
    assert ["Contributor_B/MSBNK-TEST-BD000005.txt", "", "MSBNK-TEST-BD000005", "no SMILES", ""] in rows


def test_repeated_accession_is_imported_once_and_reported(tmp_path):
    root = _copy_fixtures(tmp_path)
    shutil.copy(root / "Contributor_A" / "MSBNK-TEST-AC000001.txt", root / "Contributor_B" / "copy.txt")
    summary = import_massbank(root, tmp_path / "out")
    text = "".join(p.read_text() for p in (tmp_path / "out").glob("*.mgf"))
    assert text.count("TITLE=MSBNK-TEST-AC000001\n") == 1
    assert summary["n_records"] == 9 and summary["n_imported"] == 4
    assert summary["skipped"]["repeated ACCESSION, the first copy kept"] == 1
    result = _cli(root, "-o", tmp_path / "out2")
    assert "  skipped 1: repeated ACCESSION, the first copy kept (Contributor_B/copy.txt: MSBNK-TEST-AC000001 is " \
           "also in Contributor_A/MSBNK-TEST-AC000001.txt)" in result.stderr.splitlines()


def _broken_files(root: Path) -> dict[str, str]:
    """Write one broken record file of each kind under ``root``; ``{file name: reason}``."""
    good = (FIXTURES / "Contributor_A" / "MSBNK-TEST-AC000002.txt").read_text()
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.txt").write_bytes(b"\n  \n")
    (root / "binary.txt").write_bytes(bytes(range(256)) * 3)
    (root / "utf16.txt").write_bytes(good.encode("utf-16"))
    (root / "utf16le.txt").write_bytes(good.encode("utf-16-le"))       # no byte-order mark
    (root / "latin1.txt").write_bytes(good.replace("Mellein", "Mell\u00e9in").encode("latin-1"))
    (root / "noacc.txt").write_text("\n".join(line for line in good.splitlines() if not line.startswith("ACC")))
    utf16 = "UTF-16 text (MassBank records are UTF-8: convert it, e.g. iconv -f UTF-16 -t UTF-8)"
    return {"empty.txt": "empty file", "blank.txt": "empty file", "binary.txt": "binary file, not text",
            "utf16.txt": utf16, "utf16le.txt": utf16, "noacc.txt": "no ACCESSION line",
            "latin1.txt": "not UTF-8 text (byte 0xe9 at offset"}


def test_broken_files_are_counted_reported_and_skipped(tmp_path):
    root = _copy_fixtures(tmp_path)
    expected = _broken_files(root)
    # a UTF-8 byte-order mark is harmless: that record is imported
    bom = (FIXTURES / "Contributor_A" / "MSBNK-TEST-AC000001.txt").read_text().replace("AC000001", "AC000009")
    (root / "bom.txt").write_bytes(b"\xef\xbb\xbf" + bom.encode())
    summary = import_massbank(root, tmp_path / "out")
    assert summary["n_records"] == 8 + len(expected) + 1 and summary["n_imported"] == 5
    reasons = {e["file"]: e["reason"] for e in summary["skipped_records"]}
    for name, reason in expected.items():
        assert reasons[name].startswith(reason), (name, reasons[name])
    assert summary["not_records"] == ["README.txt"]
    assert "TITLE=MSBNK-TEST-AC000009\n" in "".join(p.read_text() for p in (tmp_path / "out").glob("*.mgf"))
    # the same from an archive: the broken members are reported, the others imported
    zpath = tmp_path / "records.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for p in sorted(root.rglob("*.txt")):
            z.write(p, "x/" + p.relative_to(root).as_posix())
    from_zip = import_massbank(zpath, tmp_path / "zout")
    assert {e["file"]: e["reason"] for e in from_zip["skipped_records"]} == {f"x/{k}": v for k, v in reasons.items()}
    result = _cli(root, "-o", tmp_path / "out2")
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "  skipped 2: empty file (blank.txt, empty.txt)" in result.stderr.splitlines()
    assert "  ignored 1 file that is not a MassBank record (README.txt)" in result.stderr.splitlines()


def test_lone_broken_record_file_is_a_one_line_error(tmp_path):
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(InputError, match=r"e\.txt: empty file"):
        import_massbank(tmp_path / "e.txt", tmp_path / "out")
    (tmp_path / "u.txt").write_bytes("ACCESSION: X\n".encode("utf-16"))
    with pytest.raises(InputError, match=r"u\.txt: UTF-16 text"):
        import_massbank(tmp_path / "u.txt", tmp_path / "out")


def test_truncated_archive_is_named_and_earlier_outputs_kept(tmp_path):
    out = tmp_path / "out"
    import_massbank(FIXTURES, out)
    before = {p.name: p.read_text() for p in out.iterdir()}
    payload = _tiny_release(tmp_path)
    cut = tmp_path / "MassBank-cut.tar.gz"
    cut.write_bytes(payload[:len(payload) // 2])
    with pytest.raises(InputError) as e:
        import_massbank(cut, out)
    assert str(e.value).startswith(f"{cut}: truncated archive") and "\n" not in str(e.value)
    result = _cli(cut, "-o", out)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"molpredict: error: {e.value}"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no MassBank record files"):
        import_massbank(tmp_path / "empty", out)
    assert {p.name: p.read_text() for p in out.iterdir()} == before    # nothing lost


def test_fetch_of_a_page_that_is_not_an_archive_names_the_url(tmp_path, serve):
    from click.testing import CliRunner
    from molpredict.cli import cli

    url, _ = serve(b"<!DOCTYPE html>\n<html><body>Sign in to continue</body></html>\n")
    with pytest.raises(InputError) as e:
        massbank.fetch_massbank(tmp_path / "mb", release="x", url=url, progress=False)
    assert str(e.value) == f"{url}: not a MassBank release archive (got an HTML page; is the URL right?)"
    assert not (tmp_path / "mb").exists()  # the downloaded page is gone, and the folder this fetch created
    result = CliRunner().invoke(cli, ["data", "fetch", "massbank", "-o", str(tmp_path / "mb"), "--url", url,
                                      "--no-progress"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"molpredict: error: {e.value}"]
    # an archive with no records: the error names the URL too, not the deleted download
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as t:
        t.add(FIXTURES / "README.txt", arcname="x/README.txt")
    url, _ = serve(empty.read_bytes())
    with pytest.raises(InputError, match=f"^{url}: no MassBank record files found"):
        massbank.fetch_massbank(tmp_path / "mb2", release="x", url=url, progress=False)
