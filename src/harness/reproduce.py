"""``hotpaths reproduce``: re-execute the notebooks headless with papermill and regenerate the tables.

All-or-nothing: notebooks run into a temporary folder (papermill_runs/.staging-<run id>/); only when every selected
notebook succeeds are the executed copies moved to papermill_runs/<tag>/, the tables to data/results/<tag>/, the
profiles to data/profiles/<tag>/, and manifest.json written. A failure leaves the committed files untouched and
keeps the failed notebook under scratch/failed/ for reading.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
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


def _move_tree(src: Path, dst: Path) -> list[Path]:
    moved = []
    if not src.exists():
        return moved
    for f in sorted(src.rglob("*")):
        if f.is_file():
            target = dst / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(f), target)
            moved.append(target)
    return moved


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
                "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    old_env = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)
    results, failed = [], None
    try:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # the bar is a convenience
            tqdm = lambda xs, **kw: xs  # noqa: E731
        bar = tqdm(nbs, desc="notebooks", unit="nb", file=sys.stdout)
        for nb in bar:
            params = load_params(nb, profile)
            out = staging / "nb" / nb.name
            t0 = time.perf_counter()
            try:
                pm.execute_notebook(str(nb), str(out), parameters=params, kernel_name="python3",
                                    cwd=str(NOTEBOOKS), progress_bar=False, log_output=False)
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

    written = []
    written += _move_tree(staging / "nb", runs / tag)
    written += _move_tree(staging / "results", root / "data" / "results" / tag)
    written += _move_tree(staging / "profiles", root / "data" / "profiles" / tag)
    shutil.rmtree(staging, ignore_errors=True)

    manifest_path = runs / tag / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    info = device_info()
    notebooks = manifest.get("notebooks", {})
    for r in results:
        notebooks[r["notebook"]] = {**r, "run_id": run_id}
    files = manifest.get("files", {})
    for f in written:
        files[str(f.relative_to(root))] = _sha256(f)
    manifest.update({
        "run_id": run_id, "profile": profile, "git_revision": git_revision(), "device": info.get("device"),
        "device_tag": tag, "torch": info.get("torch"), "cuda_runtime": info.get("cuda_runtime"),
        "driver": info.get("driver"), "python": info.get("python"), "total_wall_s": round(sum(r["wall_s"] for r in results), 1),
        "notebooks": dict(sorted(notebooks.items())), "files": dict(sorted(files.items())),
    })
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    print(f"\nwrote {len(written)} file(s) under {root}: papermill_runs/{tag}/, data/results/{tag}/, manifest {manifest_path.relative_to(root)}")
    return 0
