"""Reports and figures read from the catalog's rows: ``ncat report`` (``reports.report``,
with its circuits and labels sections) and the plotly figures that the report and the
explorer both draw (``reports.plots``). Above ``schema`` (which they read through) and
below ``jobs`` (the CLI) and ``ui`` (the explorer)."""
