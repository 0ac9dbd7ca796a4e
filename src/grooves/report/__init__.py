"""Human-readable pages about a run: the run report (`grooves report RUN_DIR`) and the watch's
inspection pages. Plots are matplotlib PNGs inlined as base64, so every page is one file.

This package imports nothing at load time: the watch imports its page writers lazily, and
`import grooves.report.html` stays cheap for a trainer that never draws.
"""
