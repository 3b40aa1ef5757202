"""The edge: everything that touches the network or the caller's filesystem before the engine runs.

The engine in `engine/` is a pure function of local files. The two callers that fetch — the CLI
(`edge/cli.py`) and the Job entrypoint (`service/job.py`) — go through `edge.inputs`, which checks
every URI against one `UriPolicy`, downloads through one transport that connects only to the address
it checked, retries transient failures, and redacts secrets from everything it reports.
"""
