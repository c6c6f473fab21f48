#!/bin/bash
# A side venv with fairseq 0.12.2 for tools/fairseq_crosscheck.py (fairseq-side), outside the repo.
# Why it is separate: fairseq 0.12.2 pins hydra-core<1.1 / omegaconf<2.1, which seqmix's venv cannot have.
# Why each step:
#  * Python 3.11 + torch 2.13.0: the CPU torch wheel on this machine is cp311 only (a py3.10 torch from PyPI is a
#    multi-GB CUDA build).
#  * pip<24.1: omegaconf 2.0.6's metadata ("PyYAML>=5.1.*") is rejected by pip>=24.1 (the 3.11.7 venv has pip 23.2).
#  * fairseq with --no-deps: it lists torchaudio, not needed for translation; its real needs are installed by hand.
#  * READTHEDOCS=1: fairseq's setup.py then builds no C/C++/Cython extension (libbleu, data_utils_fast, libnat,
#    libbase, ...); none is used by building/loading translation models or SequenceGenerator, and compiling the
#    torch C++ extensions takes long on this 2-core machine.
#  * the patch: fairseq 0.12.2's and hydra-core 1.0.7's dataclass configs use dataclass instances as field defaults
#    (``common: CommonConfig = CommonConfig()``, ``field(default=QuantNoiseConfig())``), which Python 3.11 refuses
#    ("mutable default ... use default_factory": it rejects defaults whose class has __hash__ = None). The dataclasses
#    of those files get ``unsafe_hash=True`` (a __hash__, never called), so the defaults stay plain ``field.default``
#    values, which fairseq reads (``FairseqConfig.__dataclass_fields__[k].default``); default_factory would break that.
set -euo pipefail
VENV=${VENV:-/work/fairseq-venv}
SDIST=${SDIST:-/tmp/fs/fairseq-0.12.2.tar.gz}   # pip download fairseq==0.12.2 --no-deps -d /tmp/fs
PY=${PY:-/root/.pyenv/versions/3.11.7/bin/python}
[ -f "$SDIST" ] || pip download fairseq==0.12.2 --no-deps --no-binary :all: -d "$(dirname "$SDIST")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "pip<24.1"
"$VENV/bin/pip" install torch==2.13.0 "numpy<2" cython "hydra-core==1.0.7" "omegaconf==2.0.6" bitarray regex \
    sacrebleu cffi tqdm setuptools wheel
READTHEDOCS=1 "$VENV/bin/pip" install --no-deps --no-build-isolation "$SDIST"
"$VENV/bin/python" - <<'PY'
import importlib.util, pathlib, re
DEFAULT_INSTANCE = re.compile(r"^\s+\w+: [\w.]+ = [A-Z]\w*\(\)$|field\(default=[A-Z]\w*\(\)\)", re.M)
for package in ("fairseq", "hydra"):
    root = pathlib.Path(importlib.util.find_spec(package).submodule_search_locations[0])
    for path in root.rglob("*.py"):
        text = path.read_text()
        if "examples" not in path.parts and DEFAULT_INSTANCE.search(text):
            path.write_text(re.sub(r"^(\s*)@dataclass\s*$", r"\1@dataclass(unsafe_hash=True)", text, flags=re.M))
            print("patched", path)
PY
"$VENV/bin/python" -c "import fairseq, fairseq.models.transformer, fairseq.models.lightconv, fairseq.models.fconv; print('fairseq', fairseq.__version__)"
