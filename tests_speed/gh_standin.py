"""A stand-in for GitHub's command-line client (`gh`), for the tests of `fastpath-suite nightly alert`.

    python gh_standin.py STATE_DIR issue|label ... (gh's own arguments)

It keeps a small forge in STATE_DIR/forge.json (issues with their comments and state, labels), records every call
(argv and standard input) in STATE_DIR/calls.jsonl, and refuses what gh refuses: an unknown subcommand or option, a
`--json` field gh lacks, a label that does not exist, a close reason gh does not know, an issue that is not there.
A file STATE_DIR/fail makes every call fail as gh does without a valid token (exit 1, the message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FIELDS = {"number", "title", "body", "labels", "state", "url", "comments"}


class Refused(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(message)


def load(state: Path) -> dict:
    path = state / "forge.json"
    return json.loads(path.read_text()) if path.exists() else {"issues": [], "labels": []}


def issue(forge: dict, number: str) -> dict:
    found = [i for i in forge["issues"] if str(i["number"]) == number]
    if not found:
        raise Refused(f"GraphQL: Could not resolve to an issue or pull request with the number of {number}.")
    return found[0]


def body_of(args, stdin: str) -> str:
    if args.body_file is not None:
        return stdin if args.body_file == "-" else Path(args.body_file).read_text()
    if args.body is None:
        raise Refused("must provide `--title` and `--body` (or `--fill`) when not running interactively")
    return args.body


def run(argv: list, stdin: str, forge: dict) -> str:
    parser = Parser(prog="gh")
    nouns = parser.add_subparsers(dest="noun", required=True)
    issue_cmd = nouns.add_parser("issue").add_subparsers(dest="verb", required=True)
    listing = issue_cmd.add_parser("list")
    listing.add_argument("--label", "-l", action="append", default=[])
    listing.add_argument("--state", "-s", choices=("open", "closed", "all"), default="open")
    listing.add_argument("--limit", "-L", type=int, default=30)
    listing.add_argument("--json", required=True)
    listing.add_argument("--search", "-S")
    create = issue_cmd.add_parser("create")
    create.add_argument("--title", "-t", required=True)
    create.add_argument("--body", "-b")
    create.add_argument("--body-file", "-F")
    create.add_argument("--label", "-l", action="append", default=[])
    comment = issue_cmd.add_parser("comment")
    comment.add_argument("number")
    comment.add_argument("--body", "-b")
    comment.add_argument("--body-file", "-F")
    close = issue_cmd.add_parser("close")
    close.add_argument("number")
    close.add_argument("--comment", "-c")
    close.add_argument("--reason", "-r", choices=("completed", "not planned"))
    label_cmd = nouns.add_parser("label").add_subparsers(dest="verb", required=True)
    label = label_cmd.add_parser("create")
    label.add_argument("name")
    label.add_argument("--color", "-c")
    label.add_argument("--description", "-d")
    label.add_argument("--force", "-f", action="store_true")
    args = parser.parse_args(argv)

    if args.noun == "label":
        if args.name in forge["labels"] and not args.force:
            raise Refused(f"label with name \"{args.name}\" already exists; use `--force` to update its color and "
                          "description")
        forge["labels"] = sorted(set(forge["labels"]) | {args.name})
        return ""
    if args.verb == "list":
        fields = set(args.json.split(","))
        if not fields <= FIELDS:
            raise Refused(f"Unknown JSON field: {sorted(fields - FIELDS)[0]!r}")
        found = [i for i in forge["issues"] if args.state in ("all", i["state"])
                 and all(name in i["labels"] for name in args.label)][:args.limit]
        return json.dumps([{k: v for k, v in i.items() if k in fields} for i in found])
    if args.verb == "create":
        missing = [name for name in args.label if name not in forge["labels"]]
        if missing:
            raise Refused(f"could not add label: '{missing[0]}' not found")
        number = 1 + max((i["number"] for i in forge["issues"]), default=0)
        url = f"https://github.com/example/fastpath/issues/{number}"
        forge["issues"].append({"number": number, "title": args.title, "body": body_of(args, stdin),
                                "labels": args.label, "state": "open", "url": url, "comments": []})
        return url + "\n"
    found = issue(forge, args.number)
    if args.verb == "comment":
        found["comments"].append(body_of(args, stdin))
        return found["url"] + "#issuecomment\n"
    if found["state"] == "closed":
        raise Refused(f"Issue #{args.number} is already closed")
    found["state"], found["reason"] = "closed", args.reason or "completed"
    if args.comment:
        found["comments"].append(args.comment)
    return ""


def main() -> int:
    state, argv = Path(sys.argv[1]), sys.argv[2:]
    stdin = "" if sys.stdin.isatty() else sys.stdin.read()
    with (state / "calls.jsonl").open("a") as log:
        log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
    if (state / "fail").exists():
        print("HTTP 401: Bad credentials (https://api.github.com/graphql)\nTry authenticating with:  gh auth login",
              file=sys.stderr)
        return 1
    forge = load(state)
    try:
        out = run(argv, stdin, forge)
    except Refused as err:
        print(err, file=sys.stderr)
        return 1
    (state / "forge.json").write_text(json.dumps(forge, indent=1))
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
