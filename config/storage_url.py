"""Where an object store keeps the farm's files: ``s3://bucket/prefix`` (FARM_STORAGE_URL), parsed.

The store itself, its client and what goes into it are ``tasks.wire.object_store``; the settings
read the URL here, before anything connects, so a wrong one stops a process as it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEME = "s3://"


@dataclass(frozen=True)
class S3Place:
    """A bucket and a key prefix, from ``s3://bucket/prefix`` (the prefix may be empty)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> S3Place:
        """The place ``url`` names; ValueError naming what is wrong with it."""
        if not isinstance(url, str) or not url.startswith(SCHEME):
            raise ValueError(f"object store URL {url!r} must start with {SCHEME} (s3://bucket/prefix)")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        if not bucket or "/" in bucket or not all(c.isalnum() or c in "-._" for c in bucket):
            raise ValueError(f"object store URL {url!r} names no valid bucket (letters, digits, '-', '.', '_')")
        if bucket != bucket.lower():  # S3's rule; a URL's host is read lower-cased, so one would not match
            raise ValueError(f"object store URL {url!r}: a bucket name is lower-case")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def url(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"
