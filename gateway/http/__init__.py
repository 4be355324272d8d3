"""The gateway's own HTTP routes: jobs (submit, follow, events, artifacts, cancel, webhooks) and uploads."""
