"""The run report (`grooves report RUN_DIR`, also written at the end of every run): the run's
curves, the watch's findings on the timeline, samples and config on one page. Plots are
matplotlib PNGs inlined as base64, so the page is one file.

The report reads what the trainer and the watch wrote; it never feeds back into a run. This
package imports nothing at load time: `import grooves.report.html` stays cheap for a trainer
that never draws.
"""
