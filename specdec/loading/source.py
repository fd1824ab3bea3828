"""Where a checkpoint is: a local folder, a GGUF file (or a folder + `gguf_file`), or a hub id in the local cache.

A hub id (`org/name`) is resolved in the Hugging Face cache on this machine only: `models--org--name/refs/<revision>`
names a commit, `snapshots/<commit>/` holds the files (links into `blobs/`). Nothing is ever downloaded; an id
that is not cached is a one-line error naming the cache directory. The cache directory is read when a model is
loaded (`cache_dir=` model option, else `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from specdec.loading.options import ModelOptions

__all__ = ["ModelSource", "resolve_source", "hub_cache_dir"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ModelSource:
    """A checkpoint on this machine: `folder` is what transformers reads (`gguf_file` a file name inside it)."""

    kind: str  # "folder" | "gguf" | "hub"
    folder: Path
    name: str  # what the user passed (a path or an id): for messages and served model names
    gguf_file: str | None = None
    revision: str | None = None  # hub ids: the revision asked for; `commit` is the snapshot it resolved to
    commit: str | None = None

    @property
    def display_name(self) -> str:
        """A short model name: the hub id, the GGUF file's stem or the folder's name."""
        if self.kind == "hub":
            return self.name
        if self.gguf_file is not None:
            return Path(self.gguf_file).stem
        return self.folder.resolve().name

    @property
    def where(self) -> str:
        """The file or folder, as error messages name it."""
        return str(self.folder / self.gguf_file) if self.gguf_file else str(self.folder)


def hub_cache_dir(cache_dir: str | None = None) -> Path:
    """The Hugging Face hub cache this process would read (environment read now, not at import)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def _is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and ".." not in text and not text.endswith((".gguf", "."))


def _snapshot(repo_id: str, revision: str | None, cache: Path, what: str) -> tuple[Path, str]:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    hint = (f"specdec never downloads: fetch it first (e.g. `hf download {repo_id}`"
            f"{f' --revision {revision}' if revision else ''}) or pass a local path")
    if not repo.is_dir():
        raise FileNotFoundError(f"{what}: {repo_id!r} is not a local path and not in the Hugging Face cache "
                                f"{cache}; {hint}")
    rev = revision or "main"
    if _COMMIT.match(rev):
        commit = rev
    else:
        ref = repo / "refs" / rev
        try:
            commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
        except (OSError, UnicodeDecodeError):
            commit = ""
        if not _COMMIT.match(commit):
            raise FileNotFoundError(f"{what}: {repo_id!r} has no revision {rev!r} in the Hugging Face cache {cache} "
                                    f"(no valid {ref.relative_to(cache)}); {hint}")
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        raise FileNotFoundError(f"{what}: {repo_id!r} revision {rev!r} (commit {commit[:12]}) has no snapshot in the "
                                f"Hugging Face cache {cache}; {hint}")
    return snapshot, commit


def _confined(folder: Path, name: str, what: str, key: str) -> Path:
    root = os.path.normpath(os.path.abspath(folder))
    target = os.path.normpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root or target == root:
        raise ValueError(f"{what}: {key} {name!r} is outside {folder}")
    return Path(target)


def resolve_source(spec, options: ModelOptions, *, what: str = "model") -> ModelSource:
    """The checkpoint `spec` names (a path or a hub id) under `options` (revision, gguf_file, subfolder, cache_dir).

    Local paths win over hub ids (a folder called `org/name` next to you is that folder). A local path with
    a `revision` is refused: a revision names a hub snapshot.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path or a hub id (org/name), got {type(spec).__name__}")
    text = os.fspath(spec)
    if not text or "\x00" in text:
        raise ValueError(f"{what} must be a path or a hub id, got {text!r}")
    path = Path(text).expanduser()
    if path.exists():
        if options.revision is not None:
            raise ValueError(f"{what}: model option revision={options.revision!r} applies to hub ids, but {path} is "
                             "a local path")
        kind, name = "folder", text
    elif _is_repo_id(text):
        path, commit = _snapshot(text, options.revision, hub_cache_dir(options.cache_dir), what)
        kind, name = "hub", text
    else:
        raise FileNotFoundError(f"{what} not found: {text} is not a local folder or file, nor a hub id (org/name) "
                                "in the Hugging Face cache (specdec loads local checkpoints only)")
    if options.subfolder is not None:
        if path.is_file():
            raise ValueError(f"{what}: model option subfolder applies to folders, but {path} is a file")
        path = _confined(path, options.subfolder, what, "subfolder")
        if not path.is_dir():
            raise FileNotFoundError(f"{what}: subfolder {options.subfolder!r} not found in {text}")
    gguf_file = options.gguf_file
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{what}: {path} is a file but not a .gguf file; pass a checkpoint folder, a .gguf file "
                             "or a hub id")
        if gguf_file is not None:
            raise ValueError(f"{what}: model option gguf_file={gguf_file!r} names a file inside a folder, but {path} "
                             "is already a file")
        path, gguf_file = path.parent, path.name
    elif gguf_file is not None:
        file = _confined(path, gguf_file, what, "gguf_file")
        if not file.is_file():
            raise FileNotFoundError(f"{what}: gguf_file {gguf_file!r} not found in {path}")
        if file.suffix.lower() != ".gguf":
            raise ValueError(f"{what}: gguf_file {gguf_file!r} is not a .gguf file")
    if kind == "hub":
        return ModelSource("hub", path, name, gguf_file, options.revision, commit)
    return ModelSource("gguf" if gguf_file is not None else "folder", path, name, gguf_file)
