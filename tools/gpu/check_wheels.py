"""Check the wheel bundle for the GPU machine (tools/gpu/wheels.txt and the downloaded .whl/ folder).

The GPU machine has Python 3.12.3 on x86-64 Linux and no package index, so every package the notebook stack
needs and the image lacks must travel as a wheel, with exactly one version of each (two versions of one name
stop `pip install --no-index` there). This module:

- parses wheels.txt (``name==version`` lines, ``#`` comments) and rejects duplicates and unpinned lines;
- rejects pins of packages the GPU image already has (``ALREADY_THERE``, from the device notes' list
  "Python packages already there"): carrying a second copy would shadow the image's own build;
- with a wheel folder, checks one wheel per pin at the pinned version, no stray wheels, and that every
  ``Requires-Dist`` (extras skipped, markers evaluated for CPython 3.12 on Linux x86-64) is either carried at
  a version that satisfies it or already on the image (versions of image packages are not known here).

Usage: ``python tools/gpu/check_wheels.py [--wheels-txt tools/gpu/wheels.txt] [--wheel-dir .whl]``;
exit status 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

# The GPU image's packages ("Python packages already there", read 2026-11-17), normalized with normalize().
ALREADY_THERE = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
    scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)

# Marker environment of the GPU machine's python3 (for evaluating Requires-Dist markers).
GPU_MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
    "extra": "",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def normalize(name: str) -> str:
    """PEP 503 name normalization: ``Jupyter_Core`` and ``jupyter.core`` -> ``jupyter-core``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheels_txt(text: str) -> dict[str, str]:
    """Parse wheels.txt content into ``{normalized name: version}``.

    Raises ValueError naming the line for anything other than ``name==version`` (comments and blank lines
    allowed), and for a name pinned twice.
    """
    pins: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise ValueError(f"wheels.txt line {lineno}: expected 'name==version', got {raw!r}")
        name = normalize(m.group(1))
        if name in pins:
            raise ValueError(f"wheels.txt line {lineno}: {name} is pinned twice (keep one version of each)")
        pins[name] = m.group(2)
    return pins


def pins_already_there(pins: dict[str, str]) -> list[str]:
    """Names in ``pins`` that the GPU image already has (they must not be carried)."""
    return sorted(n for n in pins if n in ALREADY_THERE)


def wheel_name_version(path: Path) -> tuple[str, str]:
    """(normalized name, version) from a wheel file name ``name-version-...whl``."""
    parts = Path(path).name.split("-")
    if len(parts) < 5 or not path.name.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {path.name!r}")
    return normalize(parts[0]), parts[1]


def wheel_requires(path: Path, marker_env: dict | None = None) -> list[str]:
    """``Requires-Dist`` entries of a wheel that apply on the GPU machine (extras and other platforms dropped).

    Markers are evaluated with ``packaging`` against ``GPU_MARKER_ENV`` (``extra`` empty, so ``extra == ...``
    requirements drop out).
    """
    from packaging.requirements import Requirement

    env = dict(GPU_MARKER_ENV if marker_env is None else marker_env)
    with zipfile.ZipFile(path) as zf:
        metas = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(metas) != 1:
            raise ValueError(f"{path.name}: expected one .dist-info/METADATA, found {len(metas)}")
        meta = Parser().parsestr(zf.read(metas[0]).decode("utf-8"))
    out = []
    for entry in meta.get_all("Requires-Dist") or []:
        req = Requirement(entry)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        out.append(entry)
    return out


def check_bundle(pins: dict[str, str], wheel_dir: Path | None) -> list[str]:
    """All problems with the pins and (when given) the downloaded wheels, one readable line each."""
    problems = [f"{n} is already on the GPU image: do not carry it" for n in pins_already_there(pins)]
    if wheel_dir is None:
        return problems
    from packaging.requirements import Requirement

    wheels: dict[str, list[Path]] = {}
    for whl in sorted(Path(wheel_dir).glob("*.whl")):
        name, _ = wheel_name_version(whl)
        wheels.setdefault(name, []).append(whl)
    for name, files in wheels.items():
        if len(files) > 1:
            problems.append(f"{name}: {len(files)} wheels ({', '.join(f.name for f in files)}); keep one")
        if name not in pins:
            problems.append(f"{files[0].name} is in {wheel_dir} but not pinned in wheels.txt")
    for name, version in pins.items():
        files = wheels.get(name, [])
        if not files:
            problems.append(f"{name}=={version}: no wheel in {wheel_dir} (run tools/gpu/build_wheels.sh)")
            continue
        got = wheel_name_version(files[0])[1]
        if got != version:
            problems.append(f"{name}: wheel is version {got}, wheels.txt pins {version}")
        for entry in wheel_requires(files[0]):
            req = Requirement(entry)
            dep = normalize(req.name)
            if dep in pins:
                if not req.specifier.contains(pins[dep], prereleases=True):
                    problems.append(f"{name} requires {entry!r} but wheels.txt pins {dep}=={pins[dep]}")
            elif dep not in ALREADY_THERE:
                problems.append(f"{name} requires {entry!r}: neither carried nor on the GPU image")
    return problems


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels-txt", type=Path, default=root / "tools/gpu/wheels.txt")
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="downloaded wheels (e.g. .whl); omit to check the list only")
    args = ap.parse_args(argv)
    pins = parse_wheels_txt(args.wheels_txt.read_text())
    problems = check_bundle(pins, args.wheel_dir)
    for p in problems:
        print(f"check_wheels: {p}", file=sys.stderr)
    if not problems:
        where = f" and {args.wheel_dir}" if args.wheel_dir else ""
        print(f"check_wheels: {len(pins)} pins in {args.wheels_txt.name}{where}: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
