"""A RUNS_DIR in object storage (s3://BUCKET/PREFIX, gs://, az://): parsing, and the few calls the runs need.

The objects under PREFIX have exactly the layout of a local RUNS_DIR (train.run.rundir), so any
stock client of the store can read them. Credentials and the endpoint come from the store's own
standard variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_NAME ...), read by the library (obstore):
they never pass through a setting, a file of the run or a log line.

Every failure becomes one StorageError line naming the store and what to fix (`store_error`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, StorageError
from ..locations import redact_uri, url_problem


@dataclass(frozen=True)
class StoreURL:
    scheme: str
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's top

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, rel: str) -> str:
        """The object name of `rel` (a path inside RUNS_DIR)."""
        return f"{self.prefix}/{rel}" if self.prefix else rel


def parse_url(text: str) -> StoreURL:
    assert not url_problem(text), text  # config validated it: `scheme://BUCKET[/PREFIX]`
    scheme, _, rest = text.partition("://")
    bucket, _, prefix = rest.partition("/")
    return StoreURL(scheme.lower(), bucket, "/".join(p for p in prefix.split("/") if p))


# Short network waits: the uploads retry on their own schedule (train.store.mirror), and a start-up
# check must say "the store does not answer" in seconds, not minutes.
CONNECT_SECONDS = 5
REQUEST_SECONDS = 60


def _client_options() -> dict:
    options = {
        "connect_timeout": _dt.timedelta(seconds=CONNECT_SECONDS),
        "timeout": _dt.timedelta(seconds=REQUEST_SECONDS),
    }
    # An endpoint given as http:// (a store on this machine or a private network) is meant: the
    # library refuses plain HTTP unless told. The library reads the variable itself for the rest.
    if endpoint().lower().startswith("http://"):
        options["allow_http"] = True
    return options


ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")


def endpoint() -> str:
    """The s3:// store's address as the library reads it ("" for AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""


def check_endpoint() -> None:
    """The s3:// endpoint variables, when set, are http(s)://HOST[:PORT] (ConfigError otherwise).

    Checked before the store's client is made: the library does not check them, and panics on a
    value without a scheme, or an empty one, with a page of Rust backtrace instead of a message."""
    from urllib.parse import urlsplit

    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            parts = urlsplit(value)
            host, _port = parts.hostname, parts.port  # .port raises on a port that is not a number
        except ValueError:
            parts, host = None, None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not host
            or redact_uri(value) != value
            or parts.path not in ("", "/")
            or any(c.isspace() for c in value)
        ):
            raise ConfigError(
                name,
                redact_uri(value),
                "the store's address, http(s)://HOST[:PORT], e.g. http://127.0.0.1:9000 (no user, key or path: "
                "credentials go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); unset it for AWS itself",
            )


# The library's own retries stay short: a failed upload is retried by the mirror with backoff,
# beside training, so one call must not block for minutes.
_RETRY = {
    "max_retries": 2,
    "retry_timeout": _dt.timedelta(seconds=10),
    "backoff": {"init_backoff": _dt.timedelta(milliseconds=200), "max_backoff": _dt.timedelta(seconds=2), "base": 2},
}


class Store:
    """The objects of one RUNS_DIR URL: read, write, conditional create and replace, list, delete."""

    def __init__(self, url: StoreURL):
        from ..extras import require

        require("store", "RUNS_DIR", str(url))
        import obstore.store as stores

        self.url = url
        kwargs = {"client_options": _client_options(), "retry_config": _RETRY}
        if url.scheme == "s3":
            check_endpoint()
        try:
            if url.scheme == "s3":
                # "etag": the store's native If-None-Match / If-Match on PUT, which the lease needs.
                self._store = stores.S3Store(url.bucket, config={"conditional_put": "etag"}, **kwargs)
            elif url.scheme == "gs":
                self._store = stores.GCSStore(url.bucket, **kwargs)
            else:
                self._store = stores.AzureStore(url.bucket, **kwargs)
        except Exception as exc:  # a variable missing or malformed (no Azure account, a bad region)
            raise StorageError(
                f"RUNS_DIR {url}: the store's client cannot be set up ({str(exc).splitlines()[0][:200]}): "
                f"set the {url.scheme}:// variables in the environment (docs/storage.md)"
            ) from None

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(self._store, *args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:  # the library's errors carry no common base but BaseError
            import obstore.exceptions as oe

            if isinstance(exc, oe.NotFoundError):
                raise FileNotFoundError(what) from None
            if isinstance(exc, (oe.AlreadyExistsError, oe.PreconditionError)):
                raise Conflict(what) from None
            raise store_error(self.url, what, exc) from None

    def put(self, rel: str, data: bytes) -> str:
        """Write one object whole (a reader sees the old or the new one); its etag."""
        import obstore as obs

        return self._call(rel, obs.put, self.url.key(rel), data)["e_tag"]

    def create(self, rel: str, data: bytes) -> str:
        """Write an object that must not exist yet (If-None-Match: *); Conflict when it does."""
        import obstore as obs

        return self._call(rel, obs.put, self.url.key(rel), data, mode="create")["e_tag"]

    def replace(self, rel: str, data: bytes, etag: str) -> str:
        """Write over an object only while it is still the one with `etag` (If-Match); else Conflict."""
        import obstore as obs

        return self._call(rel, obs.put, self.url.key(rel), data, mode={"e_tag": etag})["e_tag"]

    def get(self, rel: str) -> tuple[bytes, str]:
        """(contents, etag); FileNotFoundError when there is no such object."""
        import obstore as obs

        result = self._call(rel, obs.get, self.url.key(rel))
        return bytes(self._call(rel, lambda _s: result.bytes())), result.meta["e_tag"]

    def delete(self, rel: str) -> None:
        import obstore as obs

        try:
            self._call(rel, obs.delete, self.url.key(rel))
        except FileNotFoundError:
            pass

    def list(self, rel_prefix: str = "") -> dict[str, tuple[int, str]]:
        """{path inside RUNS_DIR: (size, etag)} of every object under `rel_prefix`."""
        import obstore as obs

        base = self.url.key(rel_prefix).rstrip("/")
        strip = len(self.url.prefix) + 1 if self.url.prefix else 0
        out = {}
        for chunk in self._call(
            rel_prefix or "the run list", lambda s: list(obs.list(s, base + "/" if base else None))
        ):
            for meta in chunk:
                out[meta["path"][strip:]] = (int(meta["size"]), meta["e_tag"] or "")
        return out

    def check(self) -> None:
        """Prove now, before any training, that the store answers, the credentials work and the bucket exists."""
        import obstore as obs

        prefix = self.url.prefix + "/" if self.url.prefix else None
        self._call("the run list", lambda s: obs.list(s, prefix, chunk_size=1).collect())


class Conflict(Exception):
    """A conditional write found the object other than expected (it exists, or someone changed it)."""


def local_md5(path: Path) -> str:
    """The ETag the store gives a single-part upload of `path`: its MD5 in quotes."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f'"{h.hexdigest()}"'


def _reason(text: str) -> str:
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if code:
        return code.group(1)
    status = re.search(r"status code: (\d{3}[^:<]*)", text)
    if status:
        return status.group(1).strip()
    if re.search(r"error sending request|connect|refused|dns|timed out|timeout", text, re.IGNORECASE):
        return "no answer"
    return text.split("\n", 1)[0][:160]


def store_error(url: StoreURL, what: str, exc: Exception) -> StorageError:
    """One line for a failed call: what the store said (its error code, never the request's headers)."""
    reason = _reason(str(exc))
    where = redact_uri(endpoint() or "the default endpoint")
    if url.scheme != "s3":
        where = f"the {url.scheme}:// service"
    if reason in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden", "ExpiredToken"):
        fix = {
            "s3": "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment",
            "gs": "check GOOGLE_APPLICATION_CREDENTIALS",
            "az": "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
        }[url.scheme]
        return StorageError(f"RUNS_DIR {url}: the store refused the credentials ({reason}) at {where}: {fix}")
    if reason == "NoSuchBucket":
        return StorageError(
            f"RUNS_DIR {url}: bucket {url.bucket!r} does not exist at {where}: create it, or fix the bucket in RUNS_DIR"
        )
    if reason == "no answer":
        check = "AWS_ENDPOINT_URL and the network" if url.scheme == "s3" else "the network"
        return StorageError(
            f"RUNS_DIR {url}: the store at {where} does not answer ({what}): check {check}, "
            "or set RUNS_DIR to a local folder"
        )
    return StorageError(f"RUNS_DIR {url}: {what}: the store answered {reason} at {where}")
