# One image: the api and the worker differ only by command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/corel

RUN apt-get update \
    && apt-get install -y --no-install-recommends dataset-fashion-mnist g++ \
    && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md alembic.ini ./
COPY corel ./corel
COPY app ./app
COPY worker ./worker
COPY migrations ./migrations
RUN pip install "torch==2.14.1" "torchvision==0.29.1" && pip install ".[service,s3-server]" \
    && python -m corel.native build --optional

RUN useradd --create-home corel && mkdir -p /srv/corel/var && chown corel /srv/corel/var
USER corel
ENV COREL_VAR_DIR=/srv/corel/var
EXPOSE 8000

# api: `corel serve --no-worker --host 0.0.0.0`; worker: `corel worker`; migrate: `corel db upgrade`;
# s3 (the artifact store of docker-compose.yml): `weed mini`
CMD ["corel", "serve", "--no-worker", "--host", "0.0.0.0", "--port", "8000"]
