"""``hotpaths reproduce``: re-execute the notebooks headless with papermill and regenerate the tables.

All-or-nothing: notebooks run into a temporary folder (papermill_runs/.staging-<run id>/); only when every selected
notebook succeeds are the executed copies moved to papermill_runs/<tag>/, the tables to data/results/<tag>/, the
profiles to data/profiles/<tag>/, and manifest.json written. A failure leaves the committed files untouched and
keeps the failed notebook under scratch/failed/ for reading.

Figures: the notebook kernels get matplotlib's inline backend (MPLBACKEND), so every ``plt.show()`` leaves its
image in the executed notebook, as it does in JupyterLab. Re-runs are quiet under git: executed notebooks lose
papermill's per-cell timestamps and durations, and a staged file that differs from the committed one only in run
ids is not moved over it; manifest.json is rewritten only when a file it lists changed (each file keeps the run id
that last wrote it under ``file_run_ids``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from hotpaths.harness.env import REPO_ROOT, device_info, device_tag, git_revision

NOTEBOOKS = REPO_ROOT / "notebooks"
RUNS = REPO_ROOT / "papermill_runs"


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def select_notebooks(only: str | None) -> list[Path]:
    """Notebooks in reading order; ``only`` = comma-separated numbers (``00,04``). Raises ValueError if none match."""
    nbs = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        want = {w.strip().zfill(2) for w in only.split(",") if w.strip()}
        bad = want - {nb.name[:2] for nb in nbs}
        if bad:
            raise ValueError(f"--only: no notebook numbered {sorted(bad)}; have {[nb.name[:2] for nb in nbs]}")
        nbs = [nb for nb in nbs if nb.name[:2] in want]
    return nbs


def load_params(nb: Path, profile: str) -> dict:
    import yaml

    p = RUNS / "params" / f"{nb.stem}.{profile}.yaml"
    if not p.exists():
        return {}
    return yaml.safe_load(p.read_text()) or {}


# The kernels' matplotlib backend: inline, so plt.show() emits the figure into the executed notebook (Agg would
# draw it and drop it). Set for the kernel processes, so it holds for every notebook, present and future.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

# Papermill metadata that changes on every run although nothing in the notebook did.
_VOLATILE_NB_KEYS = ("start_time", "end_time", "duration")


_GIT_REV = re.compile(rb"(git_revision\W+)[0-9a-f]{7,40}(\+dirty)?")
# where a run wrote its staged files, as notebooks print it: <any checkout>/papermill_runs/.staging-<run id>
_STAGING_KEY = b"/papermill_runs/.staging-"
_PATH_END = frozenset(b" \t\n\r\f\v\"'\\")  # what ends the checkout path printed before the key


def _sub_staging(data: bytes) -> bytes:
    """Every ``<any checkout>/papermill_runs/.staging-`` -> ``<root>/papermill_runs/.staging-``, in linear time.
    (The regex ``[^\\s"']*/papermill_runs/...`` backtracks quadratically over a long run without white space,
    such as an inline PNG of an executed notebook: 75+ s per notebook with figures.)"""
    out, i = [], 0
    while (j := data.find(_STAGING_KEY, i)) >= 0:
        k = j
        while k > i and data[k - 1] not in _PATH_END:
            k -= 1
        out += [data[i:k], b"<root>", _STAGING_KEY]
        i = j + len(_STAGING_KEY)
    out.append(data[i:])
    return b"".join(out)


def _comparable(data: bytes, root: Path) -> bytes:
    """What must match for a staged file to count as unchanged: the bytes, up to run ids, the checkout's absolute
    path (the staging folder printed by the setup banner and by table saves, whichever checkout ran) and the git
    revision the banner prints (the manifest records it)."""
    from hotpaths.harness.runs import without_run_ids

    data = _sub_staging(without_run_ids(data))
    data = data.replace(str(root).encode(), b"<root>")
    return _GIT_REV.sub(rb"\1<rev>", data)


def strip_volatile_metadata(path: Path, root: Path | None = None, final: Path | None = None) -> None:
    """Drop papermill's timestamps and durations (notebook and cells) and nbclient's execution timing from an
    executed notebook, numbers its cells and joins split stdout, so an unchanged run writes identical bytes."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if "id" in cell:  # nbformat invents random ids for cells that had none; number them instead
            cell["id"] = f"cell-{i:03d}"
        if cell.get("outputs"):  # how stdout is cut into messages depends on timing: join neighbouring pieces
            merged = []
            for o in cell["outputs"]:
                if (o.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                        and merged[-1].get("name") == o.get("name")):
                    merged[-1]["text"] = "".join(merged[-1]["text"]) + "".join(o["text"])
                else:
                    merged.append(o)
            cell["outputs"] = merged
    pm_nb = nb.metadata.get("papermill")
    if isinstance(pm_nb, dict) and root is not None:  # paths relative to the checkout, not this machine's
        if final is not None:  # where the file will live, not the staging folder it was run into
            pm_nb["output_path"] = str(final)
        for k in ("input_path", "output_path"):
            try:
                pm_nb[k] = str(Path(pm_nb[k]).resolve().relative_to(Path(root).resolve()))
            except (KeyError, TypeError, ValueError):
                pm_nb.pop(k, None)
    for meta in [nb.metadata] + [c.metadata for c in nb.cells]:
        pm_meta = meta.get("papermill")
        if isinstance(pm_meta, dict):
            for k in _VOLATILE_NB_KEYS:
                pm_meta.pop(k, None)
        meta.pop("execution", None)
    nbformat.write(nb, path)


def _move_tree(src: Path, dst: Path, root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """Move every file under src to the same place under dst, except those that equal the file already there up
    to run ids (and, given root, the checkout path and git revision: see _comparable). Returns (moved, kept). Each
    move is a rename (atomic on one file system)."""
    from hotpaths.harness.runs import same_but_run_ids

    def same(a: bytes, b: bytes) -> bool:
        return same_but_run_ids(a, b) or (root is not None and _comparable(a, root) == _comparable(b, root))

    moved, kept = [], []
    if not src.exists():
        return moved, kept
    for f in sorted(src.rglob("*")):
        if f.is_file():
            target = dst / f.relative_to(src)
            if target.exists() and same(target.read_bytes(), f.read_bytes()):
                kept.append(target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(f), target)
            moved.append(target)
    return moved, kept


def _kernel_manager_class():
    """A kernel manager that talks to the kernel over IPC sockets: the same machine only, and no "Kernel is running
    over TCP without encryption" warning from every kernel interleaving the progress bar."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _default_transport(self):
            return "ipc"

    return IPCKernelManager


def reproduce(*, profile: str = "quick", only: str | None = None, device: str = "auto", dry_run: bool = False,
              out_root: Path | None = None) -> int:
    """Run the selected notebooks; returns the exit code (0 ok, 1 a notebook failed).

    out_root: where papermill_runs/<tag>/, data/results/<tag>/ and data/profiles/<tag>/ go (default: the repo;
    tests point it at a temporary folder). Raises ValueError for an unknown --only number or --device cuda
    without a GPU.
    """
    import papermill as pm

    root = Path(out_root) if out_root is not None else REPO_ROOT
    runs = root / "papermill_runs"

    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # inherited by the notebook kernels
    elif device == "cuda":
        from hotpaths.harness.env import has_cuda

        if not has_cuda():
            raise ValueError("--device cuda: no CUDA device is visible to torch on this machine")
    tag = device_tag("cpu" if device == "cpu" else "auto")
    nbs = select_notebooks(only)
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{tag}-{profile}"
    print(f"hotpaths reproduce: {len(nbs)} notebook(s), profile={profile}, device={tag}, run_id={run_id}")
    if dry_run:
        for nb in nbs:
            print(f"  {nb.name}  params={load_params(nb, profile)}")
        return 0

    staging = runs / f".staging-{run_id}"
    (staging / "nb").mkdir(parents=True)
    env_keys = {"HOTPATHS_RUN_ID": run_id, "HOTPATHS_RESULTS_DIR": str(staging / "results"),
                "HOTPATHS_PROFILES_DIR": str(staging / "profiles"), "HOTPATHS_PROFILE": profile,
                "MPLBACKEND": INLINE_BACKEND, "PYTHONHASHSEED": "0"}
    old_env = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)
    results, failed = [], None
    try:
        from hotpaths.harness.progress import progress

        for nb in progress(nbs, desc="notebooks", unit="nb"):  # stderr, on a terminal only, off with --quiet
            params = load_params(nb, profile)
            out = staging / "nb" / nb.name
            t0 = time.perf_counter()
            try:
                pm.execute_notebook(str(nb), str(out), parameters=params, kernel_name="python3",
                                    cwd=str(NOTEBOOKS), progress_bar=False, log_output=False,
                                    kernel_manager_class=_kernel_manager_class())
                strip_volatile_metadata(out, root, runs / tag / nb.name)
                status = "ok"
            except Exception as e:  # papermill raises PapermillExecutionError with the cell's traceback
                status = f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                failed = (nb, e)
            results.append({"notebook": nb.name, "status": status, "wall_s": round(time.perf_counter() - t0, 1),
                            "parameters": params})
            if failed:
                break
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    width = max(len(r["notebook"]) for r in results) if results else 10
    print("\nsummary:")
    for r in results:
        print(f"  {r['notebook']:<{width}}  {r['wall_s']:>7.1f} s  {r['status']}")
    if failed:
        keep = root / "scratch" / "failed"
        keep.mkdir(parents=True, exist_ok=True)
        bad_nb = staging / "nb" / failed[0].name
        if bad_nb.exists():
            shutil.copy2(bad_nb, keep / failed[0].name)
        shutil.rmtree(staging, ignore_errors=True)
        print(f"\n{failed[0].name} failed; committed tables left untouched. Executed copy: "
              f"{keep / failed[0].name}\n{failed[1]}", file=sys.stderr)
        return 1

    written, kept = [], []
    for src, dst in ((staging / "nb", runs / tag), (staging / "results", root / "data" / "results" / tag),
                     (staging / "profiles", root / "data" / "profiles" / tag)):
        m, k = _move_tree(src, dst, root)
        written += m
        kept += k
    shutil.rmtree(staging, ignore_errors=True)

    manifest_path = runs / tag / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    info = device_info()
    notebooks = dict(old.get("notebooks", {}))
    for r in results:
        notebooks[r["notebook"]] = {**r, "run_id": run_id}
    files, file_runs = dict(old.get("files", {})), dict(old.get("file_run_ids", {}))
    for f in written:
        key = str(f.relative_to(root))
        files[key], file_runs[key] = _sha256(f), run_id
    for f in kept:  # files this run reproduced byte for byte (up to run ids): listed, with the run that wrote them
        key = str(f.relative_to(root))
        files.setdefault(key, _sha256(f))
        file_runs.setdefault(key, old.get("run_id"))
    stable = {"profile": profile, "device": info.get("device"), "device_tag": tag, "torch": info.get("torch"),
              "cuda_runtime": info.get("cuda_runtime"), "driver": info.get("driver"), "python": info.get("python"),
              "files": dict(sorted(files.items())), "file_run_ids": dict(sorted(file_runs.items()))}
    if old and not written and all(old.get(k) == v for k, v in stable.items()):
        print(f"\nno file changed under {root} (numbers identical up to run ids); manifest "
              f"{manifest_path.relative_to(root)} kept (run {old.get('run_id')})")
        return 0
    manifest = {"run_id": run_id, "git_revision": git_revision(),
                "total_wall_s": round(sum(r["wall_s"] for r in results), 1), **stable,
                "notebooks": dict(sorted(notebooks.items()))}
    from hotpaths.harness.runs import atomic_write_many

    atomic_write_many([(manifest_path, (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode())])
    print(f"\nwrote {len(written)} file(s) under {root} ({len(kept)} unchanged): papermill_runs/{tag}/, "
          f"data/results/{tag}/, manifest {manifest_path.relative_to(root)}")
    return 0
