"""`rayward view RUN_DIR ...`: a local web page of one or more runs (curves, samples, token log-probs), read from
their run directories as the runs write them.

records.py   the token record (`tokens.jsonl`): its line format, the writer the run calls, nothing else
store.py     reading a run directory incrementally: metrics, the completions log and the token record by step
server.py    the aiohttp app: the page, its static files, the JSON endpoints
cli.py       the `view` subcommand: its arguments and handler
static/      the page (index.html, app.js, view.css) and the vendored uPlot (static/uplot/)
"""
