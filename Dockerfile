# The component image for the Kubeflow Pipelines components (components/*/component.py, installed
# as dlrover_rm.components, use base_image="dlrover-rm:0.1.0"; they install nothing at run time,
# kfp included).
#   docker build -t dlrover-rm:0.1.0 .
# The steps mirror the Makefile's venv target: torch (CPU wheel) and fbgemm-gpu-cpu from the
# pins, torchrec without its dependencies (its metadata asks for the CUDA fbgemm-gpu), then the
# project with the `image` extra: what every step of both example pipelines and a job's master
# and nodes on Kubernetes import (tests/test_image_deps.py checks it against the code).
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/dlrover-rm
COPY . .

RUN pip install -c constraints.txt --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple torch==2.13.0 \
 && pip install -c constraints.txt fbgemm-gpu-cpu==1.8.0 \
 && pip install --no-deps torchrec==1.8.0 \
 && pip install -c constraints.txt ".[image]"

# Steps run from an empty working directory: in /opt/dlrover-rm the checkout's dlrover_rm/ (its
# __init__ only) would shadow the installed package, into which components/, operators/ and
# pipelines/ are mapped, for `python -c` and `python -m` (KFP's executor among them).
WORKDIR /workspace

# A training step writes its run directory under the artifact path KFP gives it.
CMD ["dlrover-rm", "--help"]
