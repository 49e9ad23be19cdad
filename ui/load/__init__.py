"""The Load tab, both modes: closed loop (two runs of N clients, differing in max batch) and open loop (a
rate sweep per max batch), running the load generator through its one door for the page
(server/load/runs.py).
The page's map: docs/page.md."""
