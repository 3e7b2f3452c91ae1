# kproxy container image: multi-stage, slim, non-root, read-only-root-filesystem friendly.
#   docker build -t <registry>/kproxy:0.1.0 .
# Runs `kproxy run --config /etc/kproxy/kproxy.yaml` (the Helm chart mounts that file).
# The Python minor the suite runs on (tests/unit/test_dockerfile.py checks it against the test venv).
ARG PYTHON_VERSION=3.11

# ---- build: wheels for kproxy and its dependencies (compilers stay in this stage)
FROM python:${PYTHON_VERSION}-slim AS build
ARG PYTHON_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# requirements.lock (`make lock`): every run-time dependency at the version the suite tested, with hashes,
# and the build backend (setuptools), so nothing unpinned is downloaded. kproxy itself is then built
# without isolation by that backend and without resolving anything; `pip check` proves the lock complete.
COPY requirements.lock ./
RUN python -m venv /opt/kproxy \
 && /opt/kproxy/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md LICENSE ./
# The package without kproxy/testing (test doubles) and kproxy/localcluster (`kproxy envtest`): .dockerignore
# leaves them out, `kproxy run` imports neither (tests/unit/test_image_contents.py runs it without them).
COPY kproxy ./kproxy
RUN /opt/kproxy/bin/pip install --no-deps --no-build-isolation . \
 && /opt/kproxy/bin/pip check \
 && /opt/kproxy/bin/pip uninstall -y setuptools pip \
 && /opt/kproxy/bin/python -m compileall -q -f --invalidation-mode unchecked-hash /opt/kproxy
# The base image ships its standard library without bytecode (its build deletes every .pyc), and the
# runtime writes none (read-only root fs): without this, every start of a pod compiled asyncio, ssl,
# email, json... from source again (seconds of a restart on a loaded node). Compiled here, copied below.
RUN python -m compileall -q --invalidation-mode unchecked-hash /usr/local/lib/python${PYTHON_VERSION}

# ---- runtime: the interpreter and the venv only
FROM python:${PYTHON_VERSION}-slim
ARG PYTHON_VERSION
# Bytecode was compiled at build time (kproxy, its dependencies and the standard library); nothing is
# written at run time (read-only root fs). Hash-checked .pyc files stay valid whatever the copies' mtimes.
ENV PATH=/opt/kproxy/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/kproxy /opt/kproxy
COPY --from=build /usr/local/lib/python${PYTHON_VERSION} /usr/local/lib/python${PYTHON_VERSION}
# A numeric non-root user (65532, the distroless "nonroot" id) so runAsNonRoot can check it.
USER 65532:65532
EXPOSE 8443 9099
ENTRYPOINT ["kproxy"]
CMD ["run", "--config", "/etc/kproxy/kproxy.yaml"]
