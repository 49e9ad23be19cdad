"""The page's Load tab: two runs of N simulated clients through this server's own API, differing only
in max batch, plotted live, then compared. The load generator itself (clients, pool and judge,
figures) is server/load/, the one `python -m server.bench load` runs; this package imports it and
never server.bench.

Module map:
    run.py         the tab's settings (declared once), a pair of runs on a thread, batch scopes
    report.py      pure: a run's points, its figures (server/load's level_row, typed), the delta
                   table, the sentence
    api.py         the /lab/load endpoints (start, poll, stop)
    tab.py         the tab's Gradio layout
    load.js        the tab's controller in the browser (start, poll, redraw)
    load_plots.js  its plots: pure SVG strings from a pair's snapshot
"""
