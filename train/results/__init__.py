"""What a finished (or running) run gives: exports, predictions, reports, the runs table, comparisons.

export.py       SavedModel + .keras + labels, checked for parity in a fresh process
                (LiteRT and ONNX files beside it: the formats extra, train/formats/)
predict.py      class and probability for image files, from the export or the weights
run_records.py  a run read back from its directory: settings, manifest, metrics, resumes
evaluation.py   the best weights on the validation set: confusion matrix, worst mistakes
plots.py        the pictures of a report and a comparison, as PNG bytes
report.py       report.html and curves.png
html.py         the style sheet, tables, notes and pictures every HTML page is made of (report, compare, sweeps)
compare.py      what differs between runs and what it did to them
runs_table.py   the runs under RUNS_DIR as a table or JSON
"""
