"""The camera filter's own stages: which spans of a video to keep (``plan``) and cutting them (``cut``)."""
