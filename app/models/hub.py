"""Downloads from the Hugging Face Hub into its standard cache, resumable across runs and verified by hash.

huggingface_hub resolves every file (endpoint, token, redirects, errors) and lays out the cache; we fetch the
bytes ourselves because its downloader starts over after an interruption, and a 20 GB GGUF must not. A partial
download lives at ``blobs/<etag>.incomplete`` (the name older huggingface_hub versions resumed from), a finished
one is checked against the Hub's recorded SHA-256 before it becomes ``blobs/<etag>``, and
``hf_hub_download`` then links it into ``snapshots/`` exactly as for any other cached file.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import re
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Collection
from urllib.parse import urlparse

import httpx2
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RemoteEntryNotFoundError,
                                    RepositoryNotFoundError)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ..engine.errors import EngineError
from ..engine.gguf_file import shard_names

CHUNK = 1 << 20
DISK_MARGIN = 256 << 20  # keep this much free beyond the download itself
PARTIALS = ".specchat-partials.json"
RETRIES = 5  # a cut or stalled transfer is resumed this many times within one pull before we give up
BACKOFF_S = 1.0  # wait before the first retry; doubled for each next one, at most BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0


class HubError(EngineError):
    """A download problem, worded for the person who started it."""


class DownloadCancelled(HubError):
    pass


class TransferCut(HubError):
    """The connection broke or stalled mid-file: worth resuming from the bytes already on disk."""


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    name: str
    size: int
    etag: str  # the SHA-256 of the content for LFS files (every GGUF on the Hub), else the git blob SHA-1
    commit: str
    url: str  # where the bytes are (the Hub or, after a redirect, a CDN)
    send_token: bool  # False for a CDN URL: the token is not theirs to see


@dataclass(frozen=True)
class Progress:
    file: str
    index: int  # 1-based position among the files being pulled
    count: int
    done: int  # bytes of this file on disk
    total: int
    note: str = ""  # e.g. "connection lost, resuming in 2 s (retry 1 of 5)"


def cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def cached_path(repo: str, name: str, cache: Path | None = None) -> Path | None:
    found = try_to_load_from_cache(repo, name, cache_dir=cache)
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def local_names(repo: str, cache: Path | None = None) -> list[str]:
    """Paths of ``repo``'s files in the cache: those of the snapshot huggingface_hub serves (``refs/main``, as
    ``cached_path`` reads them), then the partial downloads waiting to be resumed."""
    folder = Path(cache or cache_dir()) / repo_folder_name(repo_id=repo, repo_type="model")
    names = []
    try:
        snapshot = folder / "snapshots" / (folder / "refs" / "main").read_text(encoding="utf-8").strip()
        names = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    except (OSError, ValueError):
        pass
    return names + [n for n in _partials(folder / "blobs") if n not in names]


def partial_bytes(repo: str, name: str, cache: Path | None = None) -> int:
    """Bytes of an interrupted download of ``name`` waiting to be resumed (0 if none)."""
    blobs = _blobs(repo, Path(cache or cache_dir()))
    etag = _partials(blobs).get(name)
    part = blobs / f"{etag}.incomplete"
    return part.stat().st_size if etag and part.exists() else 0


def _partials(blobs: Path) -> dict[str, str]:
    """file name -> etag of the partial downloads in ``blobs`` (an etag alone does not say which file it is)."""
    try:
        return json.loads((blobs.parent / PARTIALS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _note_partial(blobs: Path, name: str, etag: str | None) -> None:
    """Record (etag) or clear (None) the partial download of ``name``; the file goes when nothing is partial."""
    known = _partials(blobs)
    if known.get(name) == etag:
        return
    known = {k: v for k, v in {**known, name: etag}.items() if v}
    record = blobs.parent / PARTIALS
    if known:
        record.write_text(json.dumps(known), encoding="utf-8")
    else:
        record.unlink(missing_ok=True)


class _Waits(logging.Handler):
    """huggingface_hub's retries, as it logs them ("'...' thrown while requesting", "HTTP Error 503 thrown ...",
    "Retrying in 2s [Retry 1/5]."), told to ``say`` in words as each wait begins: only this thread's."""

    RETRY = re.compile(r"(?:Retrying in|Waiting) ([\d.]+)s(?: before retry)? \[Retry (\d+)/(\d+)\]")
    CAUSE = re.compile(r"^(?:HTTP Error (\d+)|'(.*)') thrown while requesting")

    def __init__(self, say: Callable[[Progress], None], where: Progress):
        super().__init__(logging.WARNING)
        self.say, self.where, self.thread, self.cause = say, where, threading.get_ident(), "did not answer"

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return
        text = record.getMessage()
        if cause := self.CAUSE.match(text):
            self.cause = f"answered {cause[1]}" if cause[1] else f"did not answer ({cause[2][:80]})"
        elif retry := self.RETRY.search(text):
            wait = "rate limited" if text.startswith("Rate limited") else self.cause
            note = f"The Hub {wait}: trying again in {float(retry[1]):g} s (retry {retry[2]} of {retry[3]})."
            self.say(replace(self.where, note=note))


@contextlib.contextmanager
def hub_waits(say: Callable[[Progress], None], where: Progress):
    """While inside: each retry huggingface_hub waits for, told to ``say`` as it begins (it would wait in silence),
    as ``where`` with the wait as its note."""
    log = logging.getLogger("huggingface_hub.utils._http")
    handler = _Waits(say, where)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


def resolve(repo: str, name: str, endpoint: str | None = None) -> RemoteFile:
    """Ask the Hub where a file is, how big it is and what hash it must have. A Hub that answers 5xx or 429, or is
    slow, is asked again with huggingface_hub's backoff (say the waits with ``hub_waits``); call
    ``check_reachable`` first, so that one that takes no connection at all is told at once."""
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"Cannot download {name}: HF_HUB_OFFLINE is set. Unset it (or set it to 0) to download.")
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, name, endpoint=endpoint), endpoint=endpoint,
                                    timeout=constants.HF_HUB_ETAG_TIMEOUT, retry_on_errors=True)
    except Exception as exc:  # translated below; anything unexpected keeps its own words
        raise explain(exc, repo, name, endpoint) from exc
    if not meta.etag or not meta.commit_hash or meta.size is None:
        raise HubError(f"{endpoint or constants.ENDPOINT} did not answer like the Hugging Face Hub for {repo}/{name} "
                       "(no ETag, commit or size). Check HF_ENDPOINT.")
    url = hf_hub_url(repo, name, endpoint=endpoint)
    same_host = urlparse(meta.location).netloc == urlparse(url).netloc
    return RemoteFile(repo, name, int(meta.size), meta.etag, meta.commit_hash, meta.location, same_host)


def check_reachable(endpoint: str | None = None) -> None:
    """Raise ``httpx2.ConnectError`` (for ``explain``) at once when nothing takes a connection at the Hub's address:
    no route, a refused port, an unknown host. Any answer at all, even an error status, passes."""
    hub = (endpoint or constants.ENDPOINT).rstrip("/")
    try:
        get_session().head(hub, timeout=constants.HF_HUB_ETAG_TIMEOUT, follow_redirects=False)
    except httpx2.ConnectError:
        raise
    except httpx2.HTTPError:  # slow, or a protocol quirk: the call itself, with its retries, tells
        pass


def explain(exc: Exception, repo: str, name: str, endpoint: str | None = None) -> HubError:
    """Turn a huggingface_hub / network error into what the person should do about it."""
    hub = (endpoint or constants.ENDPOINT).rstrip("/")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError("HF_HUB_OFFLINE is set: unset it to download.")
    if isinstance(exc, GatedRepoError):
        return HubError(f"{repo} is gated: accept its license at {hub}/{repo} while logged in, then set HF_TOKEN "
                        "to a token of that account (or run `hf auth login`).")
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubError(f"{repo} has no file {name} (404). The catalog entry may be out of date: check the file "
                        f"list at {hub}/{repo}/tree/main.")
    if isinstance(exc, RepositoryNotFoundError):
        if status == 404:
            return HubError(f"Repository {repo} was not found on {hub} (404). Check the repo id.")
        has_token = bool(build_hf_headers().get("authorization"))
        return HubError(f"Repository {repo} was not found or is private ({status}). Check the repo id; if it is "
                        + ("private, the token in HF_TOKEN has no access to it." if has_token else
                           "private, set HF_TOKEN to a token with access (or run `hf auth login`)."))
    if isinstance(exc, HfHubHTTPError) and status == 401:
        return HubError(f"{hub} refused the token (401 invalid credentials). Set HF_TOKEN to a valid token "
                        f"from {hub}/settings/tokens, or unset it for public models.")
    if isinstance(exc, HfHubHTTPError):
        return HubError(f"{hub} answered {status} for {repo}/{name}. Try again later.")
    if isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError)):
        return HubError(f"Cannot reach {hub} ({type(exc).__name__}). Check the internet connection, proxy settings "
                        "or HF_ENDPOINT; a partial download resumes when you run the pull again.")
    return HubError(f"Download of {repo}/{name} failed: {exc}")


def pull_files(
    files: list[tuple[str, str]],
    cache: Path | None = None,
    endpoint: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[Path]:
    """Download ``(repo, name)`` files (split GGUFs: every shard) into the Hub cache; return their local paths.

    Files already cached are verified by hash and fetched again if damaged; partial files are resumed.
    """
    cache = Path(cache or cache_dir())
    wanted = [(repo, shard) for repo, name in files for shard in shard_names(name)]
    say: Callable[[Progress], None] = on_progress or (lambda p: None)
    if not constants.HF_HUB_OFFLINE:
        try:
            check_reachable(endpoint)
        except httpx2.ConnectError as exc:
            raise explain(exc, *wanted[0], endpoint) from exc
    remotes = []
    for i, (repo, name) in enumerate(wanted, 1):
        with hub_waits(say, Progress(name, i, len(wanted), 0, 0)):  # (no size yet)
            remotes.append(resolve(repo, name, endpoint))
    _check_disk(remotes, cache)
    paths = []
    for i, remote in enumerate(remotes, 1):
        def report(done: int, note: str = "", r=remote, i=i) -> None:
            say(Progress(r.name, i, len(remotes), done, r.size, note))

        _fetch_verified(remote, cache, report, cancel)
        try:  # huggingface_hub links the verified blob into snapshots/ and records the ref
            with hub_waits(say, Progress(remote.name, i, len(remotes), remote.size, remote.size)):
                path = hf_hub_download(remote.repo, remote.name, cache_dir=cache, endpoint=endpoint)
        except Exception as exc:
            raise explain(exc, remote.repo, remote.name, endpoint) from exc
        paths.append(Path(path))
    return paths


def _blobs(repo: str, cache: Path) -> Path:
    return cache / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"


def _check_disk(remotes: list[RemoteFile], cache: Path) -> None:
    need = 0
    for r in remotes:
        blob = _blobs(r.repo, cache) / r.etag
        part = blob.with_name(r.etag + ".incomplete")
        if not blob.exists():
            need += r.size - (part.stat().st_size if part.exists() else 0)
    if not need:
        return
    where = cache
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if need + DISK_MARGIN > free:
        raise HubError(f"Not enough disk space: the download needs {_gb(need)} plus {_gb(DISK_MARGIN)} to spare, "
                       f"and {where} has {_gb(free)} free. Free some space or point HF_HUB_CACHE at a larger disk.")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _fetch_verified(remote: RemoteFile, cache: Path, report, cancel) -> None:
    """Make ``blobs/<etag>`` hold the file's exact bytes: keep a good copy, resume a partial, refetch a bad one."""
    blobs = _blobs(remote.repo, cache)
    blob = blobs / remote.etag
    if blob.exists():
        if _digest(blob, remote.etag) == remote.etag:
            report(remote.size)
            return
        _forget(blob, cache, remote)  # damaged on disk: drop it and its snapshot links, then fetch again
    for _ in range(2):
        part = blobs / (remote.etag + ".incomplete")
        digest = _download_resuming(remote, part, report, cancel)
        if digest == remote.etag:
            part.replace(blob)
            _note_partial(blobs, remote.name, None)
            return
        part.unlink(missing_ok=True)  # corrupted in transit: the bytes cannot be trusted, start this file over
    raise HubError(f"{remote.name} failed its integrity check twice (its content does not match the Hub's hash "
                   f"{remote.etag[:12]}…). The file on the server or a proxy in between may be damaged.")


def _download_resuming(remote: RemoteFile, part: Path, report, cancel) -> str:
    """``_download``, resumed with backoff when the transfer is cut or stalls (as huggingface_hub's own downloader
    does within one call); after RETRIES the last error stands, and the partial file waits for the next pull."""
    for retry in range(RETRIES + 1):
        try:
            return _download(remote, part, report, cancel)
        except TransferCut as exc:
            if retry == RETRIES:
                raise TransferCut(f"{exc} (gave up after {RETRIES} retries)") from exc
            delay = min(BACKOFF_S * 2 ** retry, BACKOFF_MAX_S)
            done = part.stat().st_size if part.exists() else 0
            report(done, f"Connection lost: resuming in {delay:g} s (retry {retry + 1} of {RETRIES}).")
            if cancel is not None:
                if cancel.wait(delay):
                    raise DownloadCancelled(f"Download of {remote.name} stopped; run the pull again to "
                                            "resume.") from None
            else:
                time.sleep(delay)  # Ctrl-C interrupts the sleep at once
    raise AssertionError("unreachable")


def _download(remote: RemoteFile, part: Path, report, cancel) -> str:
    """Append the rest of the file to ``part`` (HTTP Range) and return the digest of the whole file."""
    part.parent.mkdir(parents=True, exist_ok=True)
    _note_partial(part.parent, remote.name, remote.etag)
    hasher = _hasher(remote.etag, remote.size)
    done = 0
    if part.exists():
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                hasher.update(chunk)
                done += len(chunk)
    if done > remote.size:
        part.unlink()
        return ""
    headers = build_hf_headers()
    if not remote.send_token:
        headers.pop("authorization", None)
    if done:
        headers["Range"] = f"bytes={done}-"
    report(done)
    try:
        if done < remote.size:
            with get_session().stream("GET", remote.url, headers=headers, follow_redirects=True,
                                      timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as resp:
                hf_raise_for_status(resp)
                mode = "ab"
                if done and resp.status_code != 206:  # the server ignored Range: take the whole body
                    hasher, done, mode = _hasher(remote.etag, remote.size), 0, "wb"
                with open(part, mode) as f:
                    for chunk in resp.iter_bytes():  # as it arrives: a cut loses nothing received
                        if cancel is not None and cancel.is_set():
                            raise DownloadCancelled(f"Download of {remote.name} stopped; run the pull "
                                                    "again to resume.") from None
                        f.write(chunk)
                        hasher.update(chunk)
                        done += len(chunk)
                        report(done)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise HubError(f"The disk filled up while downloading {remote.name}. Free some space and run the pull "
                           "again: it resumes where it stopped.") from exc
        raise
    except (HubError, KeyboardInterrupt):
        raise
    except (httpx2.TransportError, ConnectionError, TimeoutError) as exc:  # cut, reset or stalled mid-file
        raise TransferCut(f"The connection to {urlparse(remote.url).netloc} broke while downloading {remote.name} "
                          f"({type(exc).__name__}) at {done:,} of {remote.size:,} bytes. Check the internet "
                          "connection and run the pull again: it resumes where it stopped.") from exc
    except Exception as exc:
        raise explain(exc, remote.repo, remote.name) from exc
    if done != remote.size:
        raise TransferCut(f"The download of {remote.name} ended early ({done:,} of {remote.size:,} bytes). "
                       "Run the pull again to resume.")
    return hasher.hexdigest()


class _GitBlobHash:
    """git's object hash (sha1 of ``blob <size>\\0`` + content): the Hub's etag for files not stored in LFS."""

    def __init__(self, size: int):
        self._h = hashlib.sha1(f"blob {size}\0".encode())

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _hasher(etag: str, size: int):
    return hashlib.sha256() if len(etag) == 64 else _GitBlobHash(size)


def _digest(path: Path, etag: str) -> str:
    h = _hasher(etag, path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _forget(blob: Path, cache: Path, remote: RemoteFile) -> None:
    snapshots = blob.parent.parent / "snapshots"
    for link in snapshots.glob(f"*/{remote.name}") if snapshots.is_dir() else []:
        link.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)


def remove_files(files: list[tuple[str, str]], keep: Collection[tuple[str, str]] = frozenset(),
                 cache: Path | None = None) -> tuple[int, list[str]]:
    """Delete cached files and partial downloads (split GGUFs: every shard) except those in ``keep``;
    return (bytes freed, names removed)."""
    cache = Path(cache or cache_dir())
    keep_all = {(r, s) for r, n in keep for s in shard_names(n)}
    freed, removed = 0, []
    for repo, name in files:
        for shard in shard_names(name):
            if (repo, shard) in keep_all:
                continue
            blobs = _blobs(repo, cache)
            snapshots = blobs.parent / "snapshots"
            links = list(snapshots.glob(f"*/{shard}")) if snapshots.is_dir() else []
            for link in links:
                blob = link.resolve()
                link.unlink()
                if blob.exists() and blob.parent.name == "blobs" and not _still_linked(snapshots, blob):
                    freed += blob.stat().st_size
                    blob.unlink()
            part = blobs / f"{_partials(blobs).get(shard)}.incomplete"
            had_partial = part.exists()
            if had_partial:
                freed += part.stat().st_size
                part.unlink()
                _note_partial(blobs, shard, None)
            if links or had_partial:
                removed.append(shard)
    return freed, removed


def _still_linked(snapshots: Path, blob: Path) -> bool:
    return any(p.is_symlink() and p.resolve() == blob for p in snapshots.rglob("*"))
