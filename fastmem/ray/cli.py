"""``fastmem ray ...``: the cluster's commands (``fastmem.cli`` hands ``ray`` over here).

    fastmem ray status [--json]
    fastmem ray jobs run OP (--all | NAMESPACE...) [--job ID] [--ledger FILE] [--dest URL] [--json]
    fastmem ray jobs run backup --all --dest s3://bucket/backups      (restore: --from URL)

The deployment is named by options or the environment: ``--address`` (``RAY_ADDRESS``),
``--root`` (``FASTMEM_RAY_ROOT``), ``--name``, ``--shards``, ``--mode``, ``--nodes``,
``--cold``. Exit codes as ``fastmem``'s: 0 ok, 1 some stores failed or a shard did not
answer, 2 usage, 6 Ray is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import DependencyUnavailableError, FastmemError, InvalidInputError
from . import jobs
from ._config import Deployment
from ._router import Cluster

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 6


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastmem ray", description="fastmem on a Ray cluster")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="the Ray cluster (RAY_ADDRESS)")
    common.add_argument("--root", default=os.environ.get("FASTMEM_RAY_ROOT"),
                        help="where the stores live (FASTMEM_RAY_ROOT)")  # fmt: skip
    common.add_argument("--name", default=os.environ.get("FASTMEM_RAY_NAME", "default"), help="the deployment")
    common.add_argument("--shards", type=int, default=int(os.environ.get("FASTMEM_RAY_SHARDS", "256")),
                        help="shard actors, a divisor of 256: as the deployment's clients use (FASTMEM_RAY_SHARDS)")  # fmt: skip
    common.add_argument("--mode", choices=("shared", "local"), default=os.environ.get("FASTMEM_RAY_MODE", "shared"))
    common.add_argument("--nodes", default=os.environ.get("FASTMEM_RAY_NODES", ""),
                        help="local mode: the nodes' fastmem-node labels, comma-separated")  # fmt: skip
    common.add_argument("--cold", default=os.environ.get("FASTMEM_RAY_COLD"), help="the cold tier's fsspec URL")
    common.add_argument("--node-ip-address", help="this machine's address in the cluster")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", parents=[common], help="each shard: node, pid, serving, open stores")
    jobs_parser = sub.add_parser("jobs", help="fleet jobs")
    jsub = jobs_parser.add_subparsers(dest="jobs_command", required=True)
    run = jsub.add_parser("run", parents=[common], help="run an operation over many stores")
    run.add_argument("op", choices=[op for op in jobs.OPS if op != "wait"])
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every store of the deployment")
    which.add_argument("namespaces", nargs="*", default=[], metavar="NAMESPACE")
    run.add_argument("--job", help="the job's id: the same id resumes an interrupted job")
    run.add_argument("--ledger", help="the ledger file (default ~/.cache/fastmem/ray-jobs/JOB.jsonl)")
    run.add_argument("--dest", "--from", help="export, backup: a directory or fsspec URL to write to; restore: "
                     "where the backups are")  # fmt: skip
    run.add_argument("--generation", help="restore: this backup (a name under DEST/NAMESPACE/) instead of the newest")
    run.add_argument("--keep", type=int, help="backup: keep each store's newest KEEP backups, delete older ones")
    run.add_argument("--concurrency", type=int, help="stores in flight at once")
    return parser


def _cluster(args: argparse.Namespace) -> Cluster:
    if not args.root:
        raise InvalidInputError("--root (or FASTMEM_RAY_ROOT) is needed: where the stores live")
    nodes = tuple(n for n in args.nodes.split(",") if n)
    deployment = Deployment(root=args.root, name=args.name, shards=args.shards, mode=args.mode, nodes=nodes,
                            cold=args.cold)  # fmt: skip
    return Cluster(deployment, address=args.address, node_ip_address=args.node_ip_address)


def _status(args: argparse.Namespace) -> int:
    rows = _cluster(args).status()
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            state = "serving" if row.get("serving") else f"NOT SERVING {row.get('error', '')}".strip()
            print(f"shard {row['shard']:3d}  {state:12s}  node {row.get('node', '?'):12s}  "
                  f"pid {row.get('pid', '?')}  open {row.get('open', '?')}")  # fmt: skip
    return EXIT_OK if all(r.get("serving") for r in rows) else EXIT_PROBLEMS


def _run(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"dest": args.dest} if args.dest else {}
    if args.generation:
        params["generation"] = args.generation
    if args.keep is not None:
        params["keep"] = args.keep
    summary = jobs.run(args.op, "all" if args.all else args.namespaces, cluster=_cluster(args), job=args.job,
                       ledger=args.ledger, params=params, concurrency=args.concurrency,
                       progress=not args.json)  # fmt: skip
    if args.json:
        print(json.dumps({"job": summary.job, "op": summary.op, "ledger": summary.ledger, "total": summary.total,
                          "done": summary.done, "skipped": summary.skipped, "failed": summary.failed,
                          "seconds": round(summary.seconds, 3)}))  # fmt: skip
    else:
        print(f"{summary.op} {summary.job}: {summary.done} done, {summary.skipped} done before, "
              f"{len(summary.failed)} failed of {summary.total} stores in {summary.seconds:.1f} s "
              f"(ledger {summary.ledger})")  # fmt: skip
        for name, error in sorted(summary.failed.items()):
            print(f"  failed {name}: {error}")
    return EXIT_OK if summary.ok else EXIT_PROBLEMS


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return _status(args) if args.command == "status" else _run(args)
    except InvalidInputError as exc:
        sys.stderr.write(f"fastmem: error: {exc}\n")
        return EXIT_USAGE
    except DependencyUnavailableError as exc:
        sys.stderr.write(f"fastmem: error: {exc}\n")
        return EXIT_MISSING
    except FastmemError as exc:
        sys.stderr.write(f"fastmem: error: {exc}\n")
        return EXIT_PROBLEMS
