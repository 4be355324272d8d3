"""FARM_STORAGE_URL as the settings read it: a bucket and a prefix, or a clear error naming the URL."""

from __future__ import annotations

import pytest

from mediafarm.config.settings import FarmSettings
from mediafarm.config.storage_url import S3Place


def test_a_url_gives_its_bucket_and_prefix_and_keys_under_it() -> None:
    place = S3Place.parse("s3://farm/jobs/a/")
    assert (place.bucket, place.prefix) == ("farm", "jobs/a")
    assert place.key("job", "0", "out.wav") == "jobs/a/job/0/out.wav"
    assert place.url(place.key("x")) == "s3://farm/jobs/a/x"
    assert S3Place.parse("s3://farm").key("x") == "x"


@pytest.mark.parametrize(
    ("url", "problem"),
    [("farm/jobs", "must start with s3://"), ("s3:///jobs", "names no valid bucket"),
     ("s3://far m/jobs", "names no valid bucket"), ("s3://Farm/jobs", "a bucket name is lower-case")],
)  # fmt: skip
def test_a_wrong_url_is_refused_naming_it(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        S3Place.parse(url)
    # ... as the process starts: the settings read it.
    with pytest.raises(ValueError, match=problem):
        FarmSettings(storage_url=url)
