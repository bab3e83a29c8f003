# sparkpoint's image: Python 3.11, Java 17 and sparkpoint (with the Kafka, S3 and Azure extras)
# in /opt/venv. The driver and the executors of a job on Kubernetes run it (docs/kubernetes.md).
#
#   docker build -t sparkpoint:latest .
#   docker run --rm sparkpoint:latest sparkpoint --help
ARG SPARK_VERSION=4.3.0
FROM apache/spark:${SPARK_VERSION} AS spark

FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

ARG EXTRAS=kafka,s3,azure
COPY . /src
# the same install step tests/e2e/test_install.py runs into a fresh venv
RUN PYTHON=python3.11 /src/docker/install.sh /opt/venv "$EXTRAS" && rm -rf /src

ENV PATH=/opt/venv/bin:$PATH \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark
# Spark's own Kubernetes entrypoint (driver and executor pods) ships with Spark's images, not
# with the pyspark wheel: take it from the image of the Spark version pip installed
# (SPARK_VERSION must match: python -c "import pyspark; print(pyspark.__version__)")
COPY --from=spark /opt/entrypoint.sh /opt/decom.sh /opt/
WORKDIR /job
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/entrypoint.sh"]
