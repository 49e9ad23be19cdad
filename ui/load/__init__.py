"""The page's Load tab, in two modes. Closed loop: two runs of N simulated clients through this
server's own API, differing only in max batch, plotted live, then compared. Open loop: requests
arriving at a rate, swept up to saturation once per max batch (goodput, the knee, the Pareto plot,
the probe's stages per level). The load generator itself (clients, arrivals, pool and judge,
figures, the sweep) is server/load/, the one `python -m server.bench load` runs; this package
imports it and never server.bench.

Module map:
    run.py          closed loop: the settings (declared once), a pair of runs on a thread, batch scopes
    report.py       pure: a run's points, its figures (server/load's level_row, typed), the delta
                    table, the sentence
    open_run.py     open loop: the settings (declared once), a sweep per max batch on a thread
    api.py          the /lab/load endpoints (start, poll, stop), and /lab/load/open for the sweeps
    tab.py          the tab's Gradio layout: the mode, the closed-loop controls, its events
    open_tab.py     the open-loop controls and containers
    load.js         closed loop's controller in the browser (start, poll, redraw)
    load_plots.js   its plots: pure SVG strings from a pair's snapshot
    open_loop.js    open loop's controller
    open_plots.js   its plots: against the offered rate, Pareto, the probe's bars, the table
"""
