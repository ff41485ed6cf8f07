"""What the tests and the benchmarks both run against: servers, hosts and faults of their
own. Nothing here is part of the product (it is not installed); ``tests/`` and ``bench/``
import it from the repository's root, and ``bench/`` imports nothing from ``tests/``.

* :mod:`harness.wait`: ``wait_until(predicate, timeout, what)``, the one polling loop.
* :mod:`harness.servers`: a PostgreSQL cluster and a Redis server on free ports, in
  temporary directories (``PrivatePostgres``, ``PrivateRedis``), to stop, freeze and
  flush; ``free_port``, the one way to pick a port; ``terminate`` for a process group;
  ``postgres_bin``.
* :mod:`harness.stack`: corel running (``Stack``: its API's URL, its settings, its API's
  pid), started on the embedded default (``Stack.embedded``), on a PostgreSQL database of
  its own with N workers (``Stack.postgres``), attached to one started elsewhere (the
  test session's), or its processes started, stopped and killed one by one on servers
  somebody else runs (``Stack.on``: the tests that kill workers, the fault benchmark, the
  soak); the benchmarks that measure the service take one. ``spawn`` and ``corel_env``
  are the one way to start a corel process and to hand it its settings (the cluster's
  hosts use them too, inside their namespaces).
* :mod:`harness.soak`: the randomized fault soak (``SoakConfig``, ``run_soak``) over the
  service's real processes (``bench/fault_soak.py``, ``tests/app/processes/test_fault_soak.py``).
* :mod:`harness.hosts`: a cluster of hosts in network namespaces (``Cluster``,
  ``cluster_available``, the API host's ``API_TOKEN``); needs root
  (``tests/cluster``, ``bench/scale_out.py``). ``python -m harness.hosts`` cleans up after
  a killed run.
"""
