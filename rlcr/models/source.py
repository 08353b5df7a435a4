"""Where a run's model comes from: any Hugging Face causal LM, brought into the run's store once (issue 32).

``model`` may be

* a name rlcr builds itself (``smollm2-135m-instruct``, ``tiny``; :mod:`rlcr.models.smollm2`);
* a local Hugging Face checkpoint directory — copied into the store on first use under a name made of its
  *content* (``models/<digest>``, sealed), so every node reads the same bytes and a changed directory is a
  new model, never a stale cache;
* an ``s3://…`` directory: when rlcr sealed it (a checkpoint of a run), copied into the store's ``models/``
  (server-side where it can be), so its run pruning it leaves this run's model; otherwise (a plain Hugging
  Face directory someone uploaded) its listing is checked, downloaded once and sealed into the store like a
  local directory;
* a hub id (``Qwen/Qwen2.5-0.5B-Instruct``): fetched with ``huggingface_hub`` when the hub answers (the
  snapshot's links into the hub cache are followed, no others); offline, :func:`check_model` stops the run
  before Ray starts, saying how to pass a local directory instead;
* a run reference ``RUN@ITERATION`` (or ``RUN@latest``; :mod:`rlcr.runs.refs`): the sealed checkpoint that run's
  manifest names in the same store, copied into ``models/`` like any sealed directory.

A run records the copy it starts from and every resume uses that copy (:func:`run_initial_model`).

Everything read here is untrusted: listings are bounded (:data:`MAX_MODEL_FILES`, :data:`MAX_MODEL_BYTES`),
every name must pass the seal's name checks, and messages print names through :func:`printable`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

from rlcr.config import ConfigError
from rlcr.models.weights import OPTIMIZER_DIR, is_training_state
from rlcr.untrusted import InvalidInput, decode_text, parse_json, printable, read_local

log = logging.getLogger(__name__)

__all__ = ["ModelSourceError", "model_kind", "check_model", "import_model", "run_initial_model", "local_digest",
           "content_digest", "hub_reachable", "check_chat_template", "MAX_MODEL_FILES", "MAX_MODEL_BYTES"]

MAX_MODEL_FILES = 2_000
"""Most files a model directory may hold (a sharded 70B checkpoint has a few dozen)."""
MAX_MODEL_BYTES = 2 ** 40
"""Largest total size of a model directory accepted (1 TiB)."""
MAX_TOKENIZER_CONFIG_BYTES = 64 * 2 ** 20
"""Largest tokenizer_config.json read (some hold a large added-token table)."""
MAX_TEMPLATE_BYTES = 4 * 2 ** 20
"""Largest chat_template.jinja / chat_template.json read."""
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")
_DIGEST_CACHE = "model-digests.json"

Kind = Literal["builtin", "local", "remote", "hub", "run"]


class ModelSourceError(ConfigError):
    """The ``model`` setting names something that cannot be used; one line, naming it and what to do."""


def model_kind(model: str) -> Kind:
    """Which of the four sources ``model`` is (see the module docstring). A string that is neither a
    directory nor a URI nor a hub-shaped ``org/name`` raises :class:`ModelSourceError`."""
    from rlcr.models.smollm2 import BUILTIN_MODELS
    from rlcr.runs.refs import is_run_ref

    if model in BUILTIN_MODELS:
        return "builtin"
    if is_run_ref(model):  # RUN@K has no '/': never a hub id; a directory of that name is written ./RUN@K
        return "run"
    if "://" in model and not model.startswith("file://"):
        return "remote"
    path = Path(model.removeprefix("file://")).expanduser()
    if path.exists() or model.startswith(("/", ".", "~", "file://")):
        return "local"
    if _HUB_ID.fullmatch(model):
        return "hub"
    raise ModelSourceError(f"model {printable(model, 200)!r}: no such directory, and not a hub id (org/name), "
                           f"an s3:// URI or a run reference (RUN@ITERATION)")


def _check_local_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise ModelSourceError(f"{what}: no such directory")
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"{what}: not a Hugging Face checkpoint directory (no config.json)")
    if not any(p.name.endswith(_WEIGHTS) for p in path.iterdir()):
        raise ModelSourceError(f"{what}: holds no weights (*.safetensors or *.bin)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise ModelSourceError(f"{what}: holds no tokenizer (tokenizer.json / tokenizer_config.json)")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``) answers within ``timeout_s``; False when
    ``HF_HUB_OFFLINE`` is set."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout_s)
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


def check_model(model: str, *, chat_template: str | None = None, hub_timeout_s: float = 3.0,
                label: str = "model") -> Kind:
    """Early checks of ``model``, before Ray or any engine starts; returns its kind.

    A local directory must be a checkpoint with weights, a tokenizer and a chat template (or
    ``chat_template`` given); a hub id needs the hub to answer. A remote directory is checked when it is
    imported (:func:`import_model`). Raises :class:`ModelSourceError` in one line otherwise."""
    kind = model_kind(model)
    what = f"{label} {printable(model, 200)}"
    if kind == "local":
        path = Path(model.removeprefix("file://")).expanduser()
        _check_local_dir(path, what)
        check_chat_template(path, chat_template, what=what)
    elif kind == "hub" and not hub_reachable(hub_timeout_s):
        raise ModelSourceError(
            f"{what} is a Hugging Face hub id, but the hub ({_endpoint()}) cannot be reached from here (offline "
            f"or HF_HUB_OFFLINE set): download it where the hub is reachable (`hf download {model} --local-dir "
            f"DIR`) and pass model.name=DIR (a local directory) or an s3:// copy of it")
    return kind


def _endpoint() -> str:
    from huggingface_hub import constants

    return printable(constants.ENDPOINT, 100)


def check_chat_template(model_dir: str | Path, chat_template: str | None = None, *, what: str = "model") -> None:
    """The model's tokenizer must define a chat template (``tokenizer_config.json``'s ``chat_template`` or a
    ``chat_template.jinja`` file), unless the config supplies one (``chat_template``); rlcr renders every
    prompt with it, so it must also render rlcr's conversations within bounded work
    (:func:`rlcr.models.template.check_template`). Files are read bounded (:func:`rlcr.untrusted.read_local`)."""
    from rlcr.models.template import TemplateRefused, check_template

    d = Path(model_dir)
    template, tokens = chat_template, {}
    config, jinja = d / "tokenizer_config.json", d / "chat_template.jinja"
    try:  # transformers' order: the config's template, chat_template.jinja, tokenizer_config.json's
        if config.exists():
            doc = parse_json(read_local(config, MAX_TOKENIZER_CONFIG_BYTES), str(config),
                             max_bytes=MAX_TOKENIZER_CONFIG_BYTES)
            tokens = {k: v for k, v in doc.items() if k.endswith("_token") and isinstance(v, str)}
        if not template and jinja.exists():
            template = decode_text(read_local(jinja, MAX_TEMPLATE_BYTES), str(jinja))
        if not template and config.exists():
            template = _named_template(doc.get("chat_template"))
        if not template and (d / "chat_template.json").exists():
            doc = parse_json(read_local(d / "chat_template.json", MAX_TEMPLATE_BYTES), str(d / "chat_template.json"))
            template = _named_template(doc.get("chat_template"))
        if template:
            check_template(template, what, **tokens)
            return
    except TemplateRefused as e:
        raise ModelSourceError(str(e)) from None
    except InvalidInput as e:
        raise ModelSourceError(f"{what}: {e}") from None
    raise ModelSourceError(f"{what}: its tokenizer has no chat template (a base model?); set the config's "
                           f"chat_template to a Jinja template, or use an instruct model")


def _named_template(value) -> str | None:
    """A ``chat_template`` field: a template, or (several named) the ``default`` one, as transformers picks it."""
    if isinstance(value, list):
        value = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}.get("default")
    return value if isinstance(value, str) and value else None


# ------------------------------------------------------------------------------------------ content digests
def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _listing(root: Path, links_within: Path | None = None) -> dict[str, Path]:
    """Every regular file under ``root`` by relative name, bounded. Links are refused (a model directory
    that leads elsewhere is not the directory the user named), except, with ``links_within``, a link to a
    regular file inside that folder: a hub snapshot is a folder of links into its cache's ``blobs/``."""
    files: dict[str, Path] = {}
    total = 0
    for p in root.rglob("*"):  # lazily: a huge tree stops at the bound, unlisted
        if p.is_symlink() and not _link_inside(p, links_within):
            where = "outside the hub cache" if links_within else "inside a model directory"
            raise ModelSourceError(f"{printable(str(p), 200)}: a symbolic link {where} (to "
                                   f"{printable(os.readlink(p), 200)})")
        if p.is_file():
            files[p.relative_to(root).as_posix()] = p
            total += p.stat().st_size
            if len(files) > MAX_MODEL_FILES or total > MAX_MODEL_BYTES:
                raise ModelSourceError(f"{printable(str(root), 200)}: more than {MAX_MODEL_FILES:,} files or "
                                       f"{MAX_MODEL_BYTES:,} bytes; not a model directory")
    return dict(sorted(files.items()))


def _link_inside(link: Path, folder: Path | None) -> bool:
    """Whether the symbolic link ``link`` leads to a regular file inside ``folder`` (never, without one)."""
    if folder is None:
        return False
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        return False
    return target.is_file() and target.is_relative_to(folder.resolve())


def local_digest(root: str | Path, *, cache_dir: str | Path | None = None, links_within: Path | None = None) -> str:
    """A digest of a directory's content: every file's name and SHA-256. Files' digests are remembered in
    ``cache_dir`` by (path, size, mtime, inode), so a large model is hashed once, not at every start.
    ``links_within``: links to files inside that folder are followed (:func:`_listing`)."""
    root = Path(root).resolve()
    cache_file = Path(cache_dir or _default_cache()) / _DIGEST_CACHE
    try:
        known = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
        known = known if isinstance(known, dict) else {}
    except ValueError:
        known = {}
    h = hashlib.sha256()
    for name, p in _listing(root, links_within).items():
        st = p.stat()
        key = f"{p}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        digest = known.get(key)
        if not (isinstance(digest, str) and len(digest) == 64):
            digest = known[key] = _file_digest(p)
        h.update(f"{name}\0{digest}\n".encode())
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cache_file.parent, delete=False, suffix=".tmp") as f:
        json.dump(known, f)
    os.replace(f.name, cache_file)
    return h.hexdigest()[:32]


# ------------------------------------------------------------------------------------------ import
def import_model(model: str, store, *, chat_template: str | None = None, cache_dir: str | Path | None = None) -> str:
    """The URI the run reads ``model`` from: a sealed directory every node can fetch.

    Built-in names are built (:func:`rlcr.models.smollm2.resolve_model`); a sealed remote directory is copied into
    ``store`` as ``models/<digest of its seal's content id>`` (:func:`_sealed_copy`); a local directory, an
    unsealed remote directory or a hub id is copied into ``store`` (a :class:`rlcr.storage.Store`) as
    ``models/<content digest>`` and sealed, unless that copy is there already.
    ``chat_template`` (a Jinja template) replaces the tokenizer's: the model is then always copied, with the
    template as its ``chat_template.jinja``.
    """
    from rlcr.models.smollm2 import resolve_model

    kind = check_model(model, chat_template=chat_template)
    if kind == "builtin":
        built = resolve_model(model)
        return _store_copy(Path(built), store, cache_dir, chat_template) if chat_template else built
    if kind == "local":
        return _store_copy(Path(model.removeprefix("file://")).expanduser(), store, cache_dir, chat_template)
    if kind == "run":
        return _run_checkpoint(model, store, chat_template, cache_dir)
    if kind == "hub":
        snapshot, hub_cache = _hub_download(model, cache_dir)
        what = f"model {printable(model, 200)!r}"
        _check_local_dir(snapshot, what)
        check_chat_template(snapshot, chat_template, what=what)
        return _store_copy(snapshot, store, cache_dir, chat_template, links_within=hub_cache)
    return _import_remote(model, store, chat_template, cache_dir)


def _run_checkpoint(ref: str, store, chat_template: str | None, cache_dir) -> str:
    """A run reference: the sealed checkpoint it names in ``store`` (:func:`rlcr.runs.refs.resolve_checkpoint`),
    copied into the store's ``models/`` (:func:`_sealed_copy`; with ``chat_template``, as a directory with it)."""
    from rlcr.runs.refs import RunRefError, resolve_checkpoint

    try:
        uri = resolve_checkpoint(store, ref, label="model")
    except RunRefError as e:
        raise ModelSourceError(str(e)) from None
    rel = store.rel(uri)
    seal = store.read_seal(rel)
    if chat_template or seal is None:  # the template makes a new copy; an unsealed one is refused there
        return import_model(uri, store, chat_template=chat_template, cache_dir=cache_dir)
    return _sealed_copy(uri, store, rel, seal, store, cache_dir)


def content_digest(local: str | Path, *, chat_template: str | None = None, cache_dir=None,
                   links_within: Path | None = None) -> str:
    """The name (``models/<digest>``) the store's copy of the directory ``local`` (with ``chat_template``)
    has: :func:`local_digest`, combined with the template when there is one."""
    digest = local_digest(local, cache_dir=cache_dir, links_within=links_within)
    if chat_template:
        digest = hashlib.sha256(f"{digest}\0{chat_template}".encode()).hexdigest()[:32]
    return digest


def run_initial_model(cfg, run, *, lease=None, cache_dir=None, warn=None) -> str:
    """The initial policy of ``run`` (a :class:`rlcr.runs.store.RunStore`): also its KL reference and tokenizer.

    When the run starts, ``cfg.model`` is imported (:func:`import_model`) and the store's copy recorded
    (``initial-model.json``: ``models/<digest>`` and its seal's content id). Every resume uses that record,
    never the source again: the copy must still carry the recorded content id (else :class:`ModelSourceError`
    naming both), and a local directory that changed since is named with both digests through ``warn`` (it is
    not used: the run stays the run it was). Built-in models (built by rlcr, not copied) are resolved afresh."""
    name, template = cfg.model.name, cfg.model.chat_template
    kind = model_kind(name)
    if kind == "builtin" and not template:
        return import_model(name, run.store, cache_dir=cache_dir)
    recorded = run.initial_model()
    if recorded is None:
        rel = _started_from(run) or run.store.rel(import_model(name, run.store, chat_template=template,
                                                               cache_dir=cache_dir))
        recorded = run.record_initial_model({"source": name, "model": rel, "content_id": run.store.content_id(rel)},
                                            lease=lease)
    rel, what = recorded["model"], f"run {run.run_id!r}"
    seal = run.store.read_seal(rel)
    actual = run.store.parse_seal(rel, seal)["content_id"] if seal is not None else "none (it is gone)"
    if actual != recorded["content_id"]:
        raise ModelSourceError(f"{what} started from {run.store.url(rel)} with content id "
                               f"{recorded['content_id']}, but it now has {actual}; refusing to resume from another "
                               f"initial model")
    path = Path(name.removeprefix("file://")).expanduser()
    if kind == "local" and path.is_dir() and recorded["source"] == name:
        now = content_digest(path, chat_template=template, cache_dir=cache_dir)
        started = rel.rsplit("/", 1)[1]
        if now != started:
            (warn or log.warning)(f"{what}: model {printable(name, 200)} changed since the run started (digest "
                                  f"{started} then, {now} now); resuming with the model it started with, "
                                  f"{run.store.url(rel)}: start a new run to train from the changed directory")
    return run.store.url(rel)


def _started_from(run) -> str | None:
    """A run from before the record: the store copy its first iteration (or baseline) names, if still sealed."""
    from rlcr.storage import StorageError

    m = run.manifest(1) or {}
    uri = m.get("policy_in") if not m.get("policy_in_updates") else None
    uri = uri or (run.baseline() or {}).get("policy_uri")
    try:
        rel = run.store.rel(uri) if isinstance(uri, str) else None
    except StorageError:
        return None
    return rel if rel and re.fullmatch(r"models/[0-9a-f]{32}", rel) and run.store.is_complete(rel) else None


def _store_copy(local: Path, store, cache_dir, chat_template: str | None = None, *,
                links_within: Path | None = None) -> str:
    """``local`` sealed into ``store`` as ``models/<digest>``; with ``chat_template``, the copy carries it as
    ``chat_template.jinja`` (and the digest covers it), so every tokenizer loaded from the copy uses it."""
    digest = content_digest(local, chat_template=chat_template, cache_dir=cache_dir, links_within=links_within)
    rel = f"models/{digest}"
    if store.read_seal(rel) is not None:
        return store.url(rel)
    if not chat_template:
        store.put_dir(local, rel)
        return store.url(rel)
    work = Path(cache_dir or _default_cache()) / "imports"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        copy = Path(tmp) / "model"
        shutil.copytree(local, copy, ignore=shutil.ignore_patterns("chat_template.jinja", "_COMPLETE"))
        (copy / "chat_template.jinja").write_text(chat_template)
        _drop_config_template(copy / "tokenizer_config.json")
        store.put_dir(copy, rel)
    return store.url(rel)


def _drop_config_template(path: Path) -> None:
    """A ``chat_template`` inside tokenizer_config.json would win over chat_template.jinja: remove it."""
    if path.is_file():
        doc = parse_json(read_local(path, MAX_TOKENIZER_CONFIG_BYTES), str(path), max_bytes=MAX_TOKENIZER_CONFIG_BYTES)
        if doc.pop("chat_template", None) is not None:
            path.write_text(json.dumps(doc, indent=2))


def _default_cache() -> Path:
    from rlcr.storage import default_cache_dir

    return default_cache_dir()


def _hub_download(model: str, cache_dir) -> tuple[Path, Path]:
    """The hub's snapshot of ``model`` (a folder of links into the cache's ``blobs/``) and the hub cache."""
    from huggingface_hub import snapshot_download

    target = Path(cache_dir or _default_cache()) / "hub"
    try:
        return Path(snapshot_download(model, cache_dir=str(target), allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"])), target
    except Exception as e:  # noqa: BLE001 — any hub failure is one line naming the model
        raise ModelSourceError(f"model {printable(model, 200)!r}: the hub download failed "
                               f"({type(e).__name__}: {printable(str(e), 200)})") from None


def _import_remote(uri: str, store, chat_template: str | None, cache_dir) -> str:
    """A sealed remote directory as it is; an unsealed one listed, bounded, downloaded and sealed into the
    store by content."""
    from rlcr.storage import StorageError, Store, atomic_directory, new_seal

    parent, name = uri.rstrip("/").rsplit("/", 1)
    source = Store(parent, endpoint_url=store.endpoint_url)
    seal = source.read_seal(name)
    if seal is not None:
        if not chat_template:
            return _sealed_copy(uri.rstrip("/"), source, name, seal, store, cache_dir)
        from rlcr.models.adapters import fetch_model

        local = fetch_model(uri, endpoint_url=store.endpoint_url,
                            cache_dir=Path(cache_dir or _default_cache()) / "checkpoints")
        return _store_copy(local, store, cache_dir, chat_template)
    base = source._abs(name)
    listing = source.fs.find(base, detail=True)  # every key under the folder, as stored (no delimiter walk)
    if len(listing) > MAX_MODEL_FILES:
        raise ModelSourceError(f"{printable(uri, 200)}: more than {MAX_MODEL_FILES:,} files; not a model directory")
    files = _remote_files(base, listing, uri)
    try:
        new_seal(files)  # every name and size must be one a seal could list
    except StorageError as e:
        raise ModelSourceError(f"{printable(uri, 200)}: {e}") from None
    if sum(files.values()) > MAX_MODEL_BYTES:
        raise ModelSourceError(f"{printable(uri, 200)}: more than {MAX_MODEL_BYTES:,} bytes")
    what = f"model {printable(uri, 200)!r}"
    if "config.json" not in files:
        raise ModelSourceError(f"{what}: not a Hugging Face checkpoint directory (no config.json)")
    work = Path(cache_dir or _default_cache()) / "imports"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        local = Path(tmp) / "model"
        with atomic_directory(local) as part:
            for rel, size in files.items():
                target = part / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                source.fs.get_file(f"{base}/{rel}", str(target))
                if target.stat().st_size != size:
                    raise ModelSourceError(f"{what}: {printable(rel, 200)} changed while it was downloaded")
        _check_local_dir(local, what)
        check_chat_template(local, chat_template, what=what)
        return _store_copy(local, store, cache_dir, chat_template)


def _remote_files(base: str, listing: dict, uri: str) -> dict[str, int]:
    """The files of an object-store folder ``base`` from its flat key listing: name under the folder → size.
    A zero-byte key ending in ``/`` is a folder marker (what consoles write for ``sub/``) and is ignored; any
    other key whose name under the folder has an empty segment (``a//b``, ``/b``, ``b/`` with bytes) names no
    file a directory could hold, so the folder is refused in one line naming that key (never silently skipped)."""
    files: dict[str, int] = {}
    for key, meta in listing.items():
        size = int(meta.get("size") or 0)
        if meta.get("type") == "directory" or not key.startswith(base + "/"):
            continue  # s3fs's pseudo-directories (and the folder's own entry)
        name = key[len(base) + 1:]
        if size == 0 and (name == "" or name.endswith("/") and "" not in name[:-1].split("/")):
            continue  # a folder marker (the folder's own, or a sub-folder's)
        if "" in name.split("/"):
            raise ModelSourceError(f"{printable(uri, 200)}: key {printable(name, 200)!r} has an empty path segment "
                                   f"(a '//' or a leading or trailing '/'); not a file a model directory can hold")
        files[name] = size
    return files




def _sealed_copy(uri: str, source, name: str, seal: bytes, store, cache_dir) -> str:
    """A sealed directory (another run's checkpoint, a warm-start) held by this run: copied into ``store`` as
    ``models/<digest of its seal's content id>`` and sealed there, so its run pruning it
    (``orchestration.keep_checkpoints``) or rewriting it leaves this run's initial policy in place. The copy
    is server-side when both are in one object store; its training state is left out. A directory already
    in the store's ``models/`` is used as it is."""
    from rlcr.storage import COMPLETE_MARKER, StorageError, new_seal

    if uri.startswith(store.url("models") + "/"):
        return uri
    meta = source.parse_seal(name, seal)
    files = {n: size for n, size in meta["files"].items() if not is_training_state(n)}  # a new run: a fresh AdamW
    key = hashlib.sha256(f"sealed {meta['content_id']}".encode()).hexdigest()[:32]
    rel = f"models/{key}"
    if store.read_seal(rel) is not None:
        return store.url(rel)
    if store.is_local or source.protocol != store.protocol:  # no server-side copy: through this machine
        work = Path(cache_dir or _default_cache()) / "imports"
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            local = source.get_dir(name, Path(tmp) / "model", seal=seal)  # checks the seal did not change
            for n in meta["files"]:
                if is_training_state(n):
                    (local / n).unlink(missing_ok=True)
            shutil.rmtree(local / OPTIMIZER_DIR, ignore_errors=True)
            (local / COMPLETE_MARKER).unlink(missing_ok=True)
            store.put_dir(local, rel)
        return store.url(rel)
    base, dest = source._abs(name), store._abs(rel)
    try:
        store.rm(rel)  # a copy cut short before
        for n in files:
            store.fs.copy(f"{base}/{n}", f"{dest}/{n}")
        copied = {k[len(dest):].lstrip("/"): int(v.get("size") or 0)
                  for k, v in store.fs.find(dest, detail=True).items() if v.get("type") != "directory"}
    except Exception as e:  # noqa: BLE001 — any failure of the object store is one line naming both
        raise StorageError(f"copying {printable(uri, 200)} to {store.url(rel)} failed: {type(e).__name__}: "
                           f"{printable(str(e), 200)}") from None
    if copied != files:
        raise ModelSourceError(f"model {printable(uri, 200)!r}: the copy at {store.url(rel)} does not match its "
                               f"seal's file list; retry")
    _check_unchanged(source, name, seal, uri)
    store.fs.pipe_file(f"{dest}/{COMPLETE_MARKER}", new_seal(files))
    return store.url(rel)


def _check_unchanged(source, name: str, seal: bytes, uri: str) -> None:
    if source.read_seal(name) != seal:
        raise ModelSourceError(f"model {printable(uri, 200)!r} was rewritten while it was copied; retry")
