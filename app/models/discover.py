"""Find GGUF models on the Hugging Face Hub and pair them: search, a repo's GGUF files, and advice on whether a
draft suits a target before the draft is downloaded.

Search and file listing go through huggingface_hub's ``HfApi`` (so ``HF_ENDPOINT``, ``HF_TOKEN`` and its errors work
as everywhere else). The advice comes in two strengths: by name (same model family, from the repo and file names
and the Hub's GGUF metadata), and by header: the first megabytes of both files, read with HTTP Range requests,
judged by llama.cpp's own pair rule, exactly as the files will be judged once on disk. A draft that fails the rule
still drafts, as text (``engine.drafters.cross_vocab``); for a target with no draft of its own vocabulary, the catalog's
small drafts of other families are offered, ranked by size ratio (``size_ratio``). A target converted without its
MTP layers is offered the side file in its own repo that holds them (``mtp-*.gguf``, unsloth's ``MTP/``) first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from huggingface_hub import HfApi
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ..engine.compat import AS_TEXT, compatibility_problems
from ..engine.drafters.registry import head_of
from ..engine.errors import EngineError
from ..engine.gguf_file import GgufInfo, header_info
from . import hf_files, hub, size_ratio
from .catalog import load_catalog
from .check import head_verdict
from .hf_files import GgufChoice

HEADER_FIRST_READ = 1 << 20  # most GGUF headers fit; a 150k-token vocabulary needs a few MB
HEADER_MAX_READ = 64 << 20


@dataclass(frozen=True)
class RepoHit:
    repo: str
    downloads: int
    likes: int
    architecture: str  # from the Hub's GGUF metadata ("" where it has none)
    parameters: int  # total parameters per the Hub's GGUF metadata (0: unknown)
    context_length: int

    @property
    def family(self) -> str:
        return family(self.repo)


@dataclass
class Advice:
    """Whether a draft suits a target. ``checked``: judged by llama.cpp's rule on the files' headers (else by
    name only); ``ok`` None when nothing can be said; ``as_text``: the vocabularies differ, so it drafts as text."""
    ok: bool | None
    checked: bool
    lines: list[str] = field(default_factory=list)
    as_text: bool = False

    @property
    def mark(self) -> str:
        """OK: drafts in the target's own tokens; TXT: drafts as text; NO / ?: cannot, or not known."""
        return "?" if self.ok is None else "NO" if not self.ok else "TXT" if self.as_text else "OK"


def api(endpoint: str | None = None) -> HfApi:
    """HfApi for ``endpoint``, once the Hub there takes connections at all. HfApi's listings retry a refused or
    unresolvable connection five times over 23 s, in silence (its HEAD for one file does not retry); a Hub that is
    slow or answers 5xx keeps those retries."""
    hub.check_reachable(endpoint)
    return HfApi(endpoint=endpoint)


def search(query: str, limit: int = 20, endpoint: str | None = None) -> list[RepoHit]:
    """Repos with GGUF files matching ``query``, most downloaded first."""
    if hub.constants.HF_HUB_OFFLINE:
        raise hub.HubError("Cannot search the Hub: HF_HUB_OFFLINE is set. Unset it (or set it to 0) to search.")
    try:
        found = api(endpoint).list_models(search=query.strip() or None, filter="gguf", sort="downloads",
                                          limit=limit, expand=["downloads", "likes", "gguf"])
        hits = []
        for m in found:
            g = m.gguf or {}
            hits.append(RepoHit(m.id, m.downloads or 0, m.likes or 0, str(g.get("architecture") or ""),
                                int(g.get("total") or 0), int(g.get("context_length") or 0)))
    except Exception as exc:
        raise hub.explain(exc, "search", query, endpoint) from exc
    return hits


def list_gguf(repo: str, endpoint: str | None = None) -> list[GgufChoice]:
    """The repo's GGUF models, split files grouped, smallest first; vision projectors and imatrix files left out."""
    return hf_files.models(list_all_gguf(repo, endpoint))


def list_all_gguf(repo: str, endpoint: str | None = None) -> list[GgufChoice]:
    """Every GGUF of the repo, vision projectors and imatrix files too, split files grouped, smallest first."""
    try:
        entries = [e for e in api(endpoint).list_repo_tree(repo, recursive=True) if hasattr(e, "size")]
    except Exception as exc:
        raise hub.explain(exc, repo, "its file list", endpoint) from exc
    return hf_files.group(repo, [(e.path, e.size) for e in entries])


def family(name: str) -> str:
    """'bartowski/Qwen2.5-Coder-7B-Instruct-GGUF' -> 'qwen2.5-coder': the model name before its size, without the
    uploader; '' when the name has no size in it."""
    base = name.rsplit("/", 1)[-1]
    base = re.sub(r"^(google|meta|mistralai|microsoft|deepseek-ai)[_-]", "", base, flags=re.IGNORECASE)
    m = re.match(r"^(.*?)[-_ .](\d+(\.\d+)?[bBmM])(?![A-Za-z0-9])", base)
    if not m:
        return ""
    return re.sub(r"^meta-llama-", "llama-", m.group(1).lower().replace("_", "-"))


def series(fam: str) -> str:
    """'llama-3.1' -> 'llama-3': point releases of a family usually share its tokenizer (Llama 3.2 drafts 3.1)."""
    return re.sub(r"(\d)\.\d+$", r"\1", fam)


def remote_info(choice: GgufChoice, endpoint: str | None = None) -> GgufInfo:
    """The file's GGUF header, read from the Hub with Range requests (a few MB, not the model)."""
    remote = hub.resolve(choice.repo, choice.file, endpoint)
    headers = build_hf_headers()
    if not remote.send_token:
        headers.pop("authorization", None)
    size = HEADER_FIRST_READ
    while True:
        data = bytearray()
        try:
            with get_session().stream("GET", remote.url, headers={**headers, "Range": f"bytes=0-{size - 1}"},
                                      follow_redirects=True, timeout=hub.constants.HF_HUB_DOWNLOAD_TIMEOUT) as resp:
                hf_raise_for_status(resp)
                for chunk in resp.iter_bytes():  # a server that ignores Range sends it all: stop reading at size
                    data += chunk
                    if len(data) >= size:
                        break
        except Exception as exc:
            raise hub.explain(exc, choice.repo, choice.file, endpoint) from exc
        info = header_info(bytes(data[:size]), choice.file, choice.size)
        if info is not None:
            return info
        if size >= min(HEADER_MAX_READ, remote.size):
            raise EngineError(f"{choice.file}: its GGUF header could not be read from the first "
                              f"{min(size, remote.size):,} bytes; the file may be damaged.")
        size *= 4


def advise(target: GgufChoice, draft: GgufChoice, hits: dict[str, RepoHit] | None = None,
           endpoint: str | None = None, read_headers: bool = True, target_info: GgufInfo | None = None) -> Advice:
    """Can ``draft`` draft for ``target``, in the target's tokens or as text? By name first; with ``read_headers``
    confirmed by llama.cpp's rule on the two files' headers, fetched from the Hub before anything is downloaded
    (``target_info``: the target's, when already read for other candidates)."""
    hits = hits or {}
    lines = []
    tf, df = family(target.repo) or family(target.file), family(draft.repo) or family(draft.file)
    kin = "the same" if tf == df else "the same series" if series(tf) == series(df) else "different"
    ta, da = (hits[r].architecture if r in hits else "" for r in (target.repo, draft.repo))
    if tf and df:
        lines.append(f"model family by name: {tf} and {df} ({kin})")
    if ta and da and ta != da:
        lines.append(f"architectures differ ({ta} vs {da}); a draft of another architecture can still share the "
                     "tokenizer, the header check decides")
    size = f"size: {size_ratio.describe(draft.size, target.size)}"
    lines.append(size + ("; the draft is not smaller than the target: drafting will not pay"
                         if draft.size >= target.size
                         else "; over a third of the target: drafting rarely pays" if draft.size * 3 > target.size
                         else ""))
    if not read_headers:
        known = bool(tf and df)
        return Advice(True if known else None, False,
                      lines + ["not yet checked against the tokenizer: download and the pair check confirms"],
                      as_text=known and kin == "different")
    t_info, d_info = target_info or remote_info(target, endpoint), remote_info(draft, endpoint)
    if head := head_of(d_info):  # not a model: MTP layers, an assistant, a block draft... of the target, or not
        lines[-1] = size  # (its cost is a layer or a few and the output, not its size)
        ok, verdict = head_verdict(head, t_info, d_info)
        return Advice(ok, True, lines + [verdict + " (from the files' headers)"])
    problems = compatibility_problems(t_info, d_info)
    if problems:
        lines.append(f"{AS_TEXT}: " + "; ".join(problems) + " (llama.cpp's rule, on the files' headers)")
    else:
        lines.append(f"compatible: the tokenizers match by llama.cpp's rule ({t_info.n_vocab:,} and "
                     f"{d_info.n_vocab:,} tokens, read from the files' headers)")
    return Advice(True, True, lines, as_text=bool(problems))


def drafts_for(target: GgufChoice, limit: int = 5, endpoint: str | None = None) -> list[tuple[RepoHit, GgufChoice]]:
    """Candidate drafts for ``target`` by name: repos of its family's series on the Hub with files under a third of
    the target's size, most downloaded first, each with its Q8_0 file (or the largest small one): a draft is cheap
    to run, so keep its quality. The header check in ``advise`` has the last word."""
    fam = series(family(target.repo) or family(target.file))
    if not fam:
        return []
    out = []
    for hit in search(fam, limit=20, endpoint=endpoint):
        if hit.repo == target.repo or not hit.family.startswith(fam):
            continue
        files = [c for c in list_gguf(hit.repo, endpoint) if c.size * 3 <= target.size]
        if not files:
            continue
        out.append((hit, pick_draft_file(files)))
        if len(out) == limit:
            break
    return out


def other_family_drafts(target: GgufChoice, skip: set[str], limit: int = 3,
                        endpoint: str | None = None) -> list[GgufChoice]:
    """Drafts of other families for a target that has none of its own vocabulary: the catalog's small Hub drafts
    (chat models known to draft well), nearest to a 1:20 size ratio first. Sizes come from the catalog to pick
    the candidates, then from the Hub; a candidate the Hub no longer has is left out."""
    sources = {s.describe(): s for p in load_catalog().values() for s in [p.draft]
               if s and s.repo and s.repo not in skip and s.repo != target.repo}
    out = []
    for src in size_ratio.rank(sources.values(), target.size, lambda s: int(s.size_gb * 1e9)):
        try:
            out.append(hf_files.pick(list_gguf(src.repo, endpoint), src.repo, src.tag, src.side_file))
        except EngineError:
            continue
        if len(out) == limit:
            break
    return size_ratio.rank(out, target.size, lambda c: c.size)


def judged_drafts(target: GgufChoice, endpoint: str | None = None, info: GgufInfo | None = None
                  ) -> list[tuple[RepoHit | None, GgufChoice, Advice]]:
    """Drafts for ``target``, each with its advice from the files' headers (the target's read once, unless given as
    ``info``): the MTP side files in its own repo that suit it, then its family's, those that share its tokens
    ahead; where none does, the catalog's drafts of other families after them, drafted as text, ranked by size
    ratio (no ``RepoHit``: side files and the catalog's come from no search)."""

    info = info or remote_info(target, endpoint)

    def judge(hit: RepoHit | None, c: GgufChoice):
        return hit, c, advise(target, c, {hit.repo: hit} if hit else {}, endpoint, target_info=info)

    judged = [judge(hit, c) for hit, c in drafts_for(target, endpoint=endpoint)]
    judged.sort(key=lambda j: j[2].as_text)  # stable: most downloaded first within each kind
    if not info.nextn_layers:  # (a model that carries its MTP layers drafts with those)
        judged = [j for c in mtp_side_files(target, endpoint) if (j := judge(None, c))[2].ok] + judged
    if not any(a.ok and not a.as_text for _, _, a in judged):
        skip = {c.repo for _, c, _ in judged}
        judged += [judge(None, c) for c in other_family_drafts(target, skip, endpoint=endpoint)]
    return judged


def mtp_side_files(target: GgufChoice, endpoint: str | None = None) -> list[GgufChoice]:
    """The files of MTP layers in the target's own repo (by name: ``mtp-``, an ``MTP/`` folder), largest first:
    unsloth's repos ship the layers a model was converted without beside it. The headers decide (``advise``):
    Gemma 4's assistants go by the same names."""
    files = [c for c in list_all_gguf(target.repo, endpoint) if hf_files.side_kind(c.file) == "mtp"]
    return sorted(files, key=lambda c: -c.size)


def ref_tag(c: GgufChoice) -> str:
    """What names ``c`` after ``repo:`` (as -hf / -hfd take it): its quantization, or for a side file, which a tag
    alone would not tell from a model of that quantization, its file."""
    return c.file if hf_files.side_kind(c.file) else c.quantization or c.file


def pick_draft_file(files: list[GgufChoice]) -> GgufChoice:
    by_quant = {c.quantization: c for c in files}
    return by_quant.get("Q8_0") or max(files, key=lambda c: c.size)


def choose(ref: str, role: str = "target", endpoint: str | None = None) -> GgufChoice:
    """``owner/name[:QUANT|:FILE.gguf]`` (llama.cpp's ``-hf`` form) -> one GGUF model of that repo. Without a tag a
    target gets Q4_K_M (llama.cpp's default), else the smallest file; a draft Q8_0, else its largest small file."""
    repo, _, tag = ref.partition(":")
    if repo.count("/") != 1:
        raise EngineError(f"{ref!r} is not a Hub repo: write owner/name, optionally :QUANT or :FILE.gguf "
                          "(e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M).")
    files = list_gguf(repo, endpoint)
    if not files:
        raise EngineError(f"{repo} has no GGUF model files (vision projectors and imatrix files do not count).")
    if tag:
        return hf_files.pick(files, repo, tag)  # as llama.cpp's -hf: any case, a whole label, not a side file
    models = [c for c in files if not hf_files.side_kind(c.file)] or files
    found = [c for c in models if c.quantization == ("Q8_0" if role == "draft" else "Q4_K_M")]
    return found[0] if found else pick_draft_file(models) if role == "draft" else models[0]
