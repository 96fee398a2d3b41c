# The image the manifests under deploy/ run: ghcr.io/corepin/corepin:0.1.0 (a placeholder name:
# build it, push it to your own registry, then set the name in deploy/default's `images:`).
#   docker build -t ghcr.io/corepin/corepin:0.1.0 .
# One image for every command (agent, controller, scheduler, extender, webhook); the manifests
# choose the command. It runs as an unprivileged user unless the manifest says otherwise (the
# agent's DaemonSet runs it privileged as root).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY src ./src
# Dependencies come from the package's metadata. Bytecode is compiled here because the root
# filesystem is read-only at run time; the sources are removed once installed.
RUN pip install --no-cache-dir . \
    && python -m compileall -q "$(python -c 'import corepin, os; print(os.path.dirname(corepin.__file__))')" \
    && rm -rf /src
WORKDIR /

USER 65532:65532
ENTRYPOINT ["corepin"]
CMD ["--help"]
