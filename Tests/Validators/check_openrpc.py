#!/usr/bin/env python3
"""Validates OpenRPC documents against the rules in openrpc-1.3.schema.json beside this file,
with the jsonschema package (Debian's python3-jsonschema), which nobody on this project wrote.

    check_openrpc.py DOCUMENTS.json

DOCUMENTS.json is an object of documents by service name (what `sb describe --json` prints).
Prints one line per violation ("SERVICE: PATH: MESSAGE") and exits 1 if there is any.
"""
import json
import os
import sys

import jsonschema

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "openrpc-1.3.schema.json")) as file:
    rules = json.load(file)
with open(sys.argv[1]) as file:
    documents = json.load(file)

validator = jsonschema.Draft7Validator(rules)
problems = 0
for service, document in sorted(documents.items()):
    for error in validator.iter_errors(document):
        path = "/".join(str(part) for part in error.absolute_path)
        print("%s: /%s: %s" % (service, path, error.message))
        problems += 1
print("%d documents checked, %d problems" % (len(documents), problems))
sys.exit(1 if problems else 0)
