"""Ray machinery the stages share.

    group.py       actor groups: `ray.remote` with names and resources, handles, fan-out, pings, restarts
    pool.py        the pool base: membership, replacement, scale/set_bounds, autoscaling, metrics, stats
    autoscale.py   the pools' autoscaling policy (pure): load samples in, a target and its reason out
    ray_compat.py  every use of Ray's private APIs, checked on the pinned Ray version
    net.py         free ports and node addresses
    cpus.py        which cores a CPU actor computes on
    error_text.py  an error in one line
    completions.py the completions logs' writer: rows from the driver, completions from their payloads
    control.py     the run's control mailbox: a client's requests to the driver's loop (`rayward scale --generators`)
"""
