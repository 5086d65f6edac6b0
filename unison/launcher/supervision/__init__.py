"""One launch watched to its end: keep each rank, learn the order of deaths, name the rank that failed, clean up.

`supervise` runs one mpiexec; `keeper` is each rank's parent (run by its path, standard library and
`unison._contract` only); `deaths` and `blame` decide whom to name; `relay` carries the markers of
ranks on other hosts over `line_server`, the launcher's signed line server; `reaper` and `segments`
remove what a launch leaves behind.
"""
