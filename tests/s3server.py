"""A real S3 endpoint for the tests: a moto server on 127.0.0.1 that can be stopped and restarted."""

import socket

import boto3

BUCKET = "rlcr-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A real S3 endpoint (moto) that the test can stop and start again; its data survives restarts."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._cls = ThreadedMotoServer
        self.server = None

    def start(self):
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        if self.server is not None:  # idempotent: a retried task calls the hook again
            self.server.stop()
            self.server = None

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint)

    def keys(self, prefix=""):
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))
