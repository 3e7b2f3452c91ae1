# kproxy container image: multi-stage, slim, non-root, read-only-root-filesystem friendly.
#   docker build -t <registry>/kproxy:0.1.0 .
# Runs `kproxy run --config /etc/kproxy/kproxy.yaml` (the Helm chart mounts that file).
ARG PYTHON_VERSION=3.12

# ---- build: wheels for kproxy and its dependencies (compilers stay in this stage)
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kproxy ./kproxy
RUN python -m venv /opt/kproxy \
 && /opt/kproxy/bin/pip install --upgrade pip \
 && /opt/kproxy/bin/pip install . \
 && /opt/kproxy/bin/pip uninstall -y pip \
 && /opt/kproxy/bin/python -m compileall -q /opt/kproxy

# ---- runtime: the interpreter and the venv only
FROM python:${PYTHON_VERSION}-slim
# Bytecode was compiled at build time; nothing is written at run time (read-only root fs).
ENV PATH=/opt/kproxy/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/kproxy /opt/kproxy
# A numeric non-root user (65532, the distroless "nonroot" id) so runAsNonRoot can check it.
USER 65532:65532
EXPOSE 8443 9099
ENTRYPOINT ["kproxy"]
CMD ["run", "--config", "/etc/kproxy/kproxy.yaml"]
