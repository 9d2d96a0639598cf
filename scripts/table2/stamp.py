"""Stamp kept results of Table 2 in miniature that were kept before results carried their identity.

    python scripts/table2/stamp.py results/mini_study_v2 --data_dir=data/mini2
    python scripts/table2/stamp.py results/mini_study_v2_rates --data_dir=data/mini2 --pins=results/mini_study_v2/data.json

Each result is first checked: its name against its own fields (scripts/table2/store.py: read_kept), the data
file its protocol decodes against the study's pins (--pins, default <folder>/data.json) and its task ids against
that file's (the same tasks, in order, as many as the protocol decodes). Then it gains the study, the data file and
its sha256, the model's manifest digest where the decoded checkpoint is kept (else null), a digest of its task ids
and one of its whole content, so that readers refuse it renamed, cut or edited. A stamped result is checked and left
as it is. Nothing is written unless every result passes.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import common  # noqa: E402
from scripts.table2 import store  # noqa: E402

FILES = {"test": "test.jsonl", "reworded": "test_reworded.jsonl", "val": "val.jsonl"}
KEPT_MODELS = {"base": "reference/mini2/adapt"}  # decoded from the kept copy itself (the others from run folders)


def kept_files(folder: str) -> list[tuple[str, bool]]:
    """(path, named by its fields) of every result: <folder>/<model>/step_*.json, or flat <model>_n<n>_tau_<tau>.json
    files (rate_check.py's layout, checked by rate_name)."""
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            found += [(os.path.join(path, f), True) for f in sorted(os.listdir(path)) if f.startswith("step_")]
        elif name.endswith(".json") and name != "data.json" and "_tau_" in name:
            found.append((path, False))
    return found


def rate_name(record: dict) -> str:
    return f"{record['model']}_n{len(record['task_ids'])}_tau_{record['tau']:g}.json"


def data_ids(data_dir: str, name: str) -> list[str]:
    with open(os.path.join(data_dir, name)) as f:
        return [json.loads(line)["task_id"] for line in f if line.strip()]


def check(path: str, named: bool, data_dir: str, pins: dict[str, str]) -> dict:
    """The result at path, checked against its name and the pinned data (one line naming file and field if not)."""
    record = store.read_kept(path, named_by_fields=named)
    if not named and os.path.basename(path) != rate_name(record):
        raise SystemExit(f"{path}: model/n/tau: the fields say {rate_name(record)}: restore it (git checkout)")
    file = FILES.get(record["protocol"])
    if file is None:
        raise SystemExit(f"{path}: protocol: {record['protocol']!r} is none of {', '.join(FILES)}")
    if common.file_sha256(os.path.join(data_dir, file)) != pins.get(file):
        raise SystemExit(f"{os.path.join(data_dir, file)} is not the data pinned for it: rebuild the study's data")
    ids = data_ids(data_dir, file)
    if record["task_ids"] != sorted(ids[:len(record["task_ids"])], key=lambda t: int(t.rsplit("/", 1)[1])):
        raise SystemExit(f"{path}: task_ids: not the first {len(record['task_ids'])} tasks of {file}")
    if "digest" in record and record.get("data_sha256") != pins[file]:
        raise SystemExit(f"{path}: data_sha256: not the pinned {file}")
    return record


def stamped(record: dict, study: str, data_sha: str, file: str) -> dict:
    if "digest" in record:
        return record
    kept = KEPT_MODELS.get(record["model"])
    digest = common.file_sha256(os.path.join(kept, common.MANIFEST)) if kept else None
    return store.stamp(dict(record, study=study, data_file=file, data_sha256=data_sha, model_digest=digest))


def main(argv: list[str] | None = None) -> int:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("folder", help="a folder of kept results")
    p.add_argument("--data_dir", default="data/mini2", help="the study's data, as its pins describe it")
    p.add_argument("--pins", default="", help="the study's data.json (default: the folder's own)")
    p.add_argument("--study", default="v2", help="the study the results belong to, recorded in each")
    args = p.parse_args(argv)
    pins_path = args.pins or os.path.join(args.folder, "data.json")
    pins = store.read_json(pins_path, ("sha256",))["sha256"]
    results = [(path, check(path, named, args.data_dir, pins)) for path, named in kept_files(args.folder)]
    changed = 0
    for path, record in results:
        new = stamped(record, args.study, pins[FILES[record["protocol"]]], FILES[record["protocol"]])
        if new is not record:
            with open(path + ".tmp", "w") as f:
                json.dump(new, f)
            os.replace(path + ".tmp", path)
            changed += 1
    print(f"{args.folder}: {len(results)} results checked against {pins_path}; {changed} stamped")
    return changed


if __name__ == "__main__":
    main()
