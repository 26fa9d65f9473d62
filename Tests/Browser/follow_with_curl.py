#!/usr/bin/env python3
"""Follows a gateway's /events with curl, as a script would: on each cut it reconnects with
Last-Event-ID, the id of the last event it got.

    follow_with_curl.py URL LAST_KEY SECONDS

Prints one JSON line per event ({"event", "id", "data"}) and, once an event for LAST_KEY has
come, {"connections": N} and exits 0; exits 1 when SECONDS pass first.
Standard library only.
"""
import json
import subprocess
import sys
import time


def main():
    url, last_key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    deadline = time.time() + seconds
    last_id = None
    connections = 0
    while time.time() < deadline:
        args = ["curl", "-sN", "--max-time", str(max(1, int(deadline - time.time()))), "-H", "Accept: text/event-stream"]
        if last_id is not None:
            args += ["-H", "Last-Event-ID: " + last_id]
        connections += 1
        curl = subprocess.Popen(args + [url], stdout=subprocess.PIPE, text=True)
        event, done = {}, False
        for line in curl.stdout:
            line = line.rstrip("\n")
            if line == "":
                # The end of an event: its id becomes the one to resume from.
                if "id" in event:
                    last_id = event["id"]
                if "name" in event:
                    data = json.loads(event.get("data", "null"))
                    print(json.dumps({"event": event["name"], "id": event.get("id"), "data": data}), flush=True)
                    done = isinstance(data, dict) and data.get("key") == last_key
                event = {}
                if done:
                    break
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event["name"] = value
            elif field in ("id", "data"):
                event[field] = value
        curl.kill()
        curl.wait()
        if done:
            print(json.dumps({"connections": connections}), flush=True)
            sys.exit(0)
        time.sleep(0.2)
    sys.exit(1)


if __name__ == "__main__":
    main()
