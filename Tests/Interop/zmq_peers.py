#!/usr/bin/env python3
"""Plain pyzmq peers for Switchboard's kernel, written from the RFCs alone:
a 7/MDP worker, a 7/MDP client (with an 8/MMI query), an 18/MDP (Majordomo 0.2)
worker and client, and a 12/CHP subscriber.

Usage:
  zmq_peers.py worker BROKER SERVICE       echo every request until SIGTERM
  zmq_peers.py client BROKER SERVICE BODY  send one request, print the reply body's frames, a line each
  zmq_peers.py worker02 BROKER SERVICE PARTS [die]
                                           18/MDP: answer every request with PARTS PARTIAL replies
                                           ("part-1"...), then a FINAL echoing the body; with "die",
                                           exit after the parts instead, without a FINAL
  zmq_peers.py client02 BROKER SERVICE BODY
                                           18/MDP: send one request; print every PARTIAL and the
                                           FINAL as JSON lines {"final": bool, "body": [text...]}
  zmq_peers.py subscribe SNAPSHOT PUBLISHER SUBTREE COUNT
                                           print the snapshot, then COUNT live updates, as JSON lines
Exit status 0 on success, 1 on a protocol error, 2 on a timeout.

With SB_KEY_DIR naming a folder that holds the keys (as for sb: the folder where
`switchboard up` keeps them, e.g. data/keys), the client and the subscriber use CURVE with
client.key and kernel.pub there.
"""
import json
import os
import signal
import sys

import zmq

TIMEOUT_MS = 10000


def fail(code, message):
    print(message, file=sys.stderr)
    sys.exit(code)


def key_file_value(path, name):
    with open(path) as handle:
        for line in handle:
            if line.split("=", 1)[0].strip() == name:
                return line.split("=", 1)[1].strip().encode()
    fail(1, "%s holds no %s" % (path, name))


def secure(socket):
    """CURVE as a client, with the keys in SB_KEY_DIR, when it names a folder that holds them."""
    folder = os.environ.get("SB_KEY_DIR")
    if not folder or not os.path.exists(os.path.join(folder, "kernel.pub")):
        return
    socket.curve_serverkey = key_file_value(os.path.join(folder, "kernel.pub"), "public-key")
    socket.curve_publickey = key_file_value(os.path.join(folder, "client.key"), "public-key")
    socket.curve_secretkey = key_file_value(os.path.join(folder, "client.key"), "secret-key")


def exit_when_parent_is_gone():
    """The lifeline: stdin is a pipe only the process that started this one writes to;
    end-of-file there means it is gone (even by SIGKILL)."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


# The worker protocol of each version: the frames before the command, and the commands.
# 7/MDP (MDPW01) starts with an empty frame and answers with one REPLY (0x03); 18/MDP
# (MDPW02) has no empty frame and answers with PARTIALs, then a FINAL.
WORKER = {
    "0.1": {"head": [b"", b"MDPW01"], "ready": b"\x01", "request": b"\x02", "final": b"\x03",
            "heartbeat": b"\x04", "disconnect": b"\x05"},
    "0.2": {"head": [b"MDPW02"], "ready": b"\x01", "request": b"\x02", "partial": b"\x03", "final": b"\x04",
            "heartbeat": b"\x05", "disconnect": b"\x06"},
}


def leave(context, socket, status, last=None, linger=200):
    """Sends `last` if the broker can take it at once, gives what is queued `linger` ms to
    go out (a process that exits at once loses it), and exits. A worker told to stop waits
    for no kernel: a test may have stopped it first."""
    if last is not None:
        try:
            socket.send_multipart(last, zmq.DONTWAIT)
        except zmq.Again:
            pass
    socket.linger = linger
    socket.close()
    context.term()
    os._exit(status)


def serve(broker, service, version, answer):
    """Registers as a worker of SERVICE and calls answer(send, client, body) for each
    request, with send(command, frames) sending one command of this version, until SIGTERM
    or DISCONNECT."""
    import threading
    threading.Thread(target=exit_when_parent_is_gone, daemon=True).start()
    protocol = WORKER[version]
    head = protocol["head"]
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    socket.sndtimeo = 1000  # a send to a kernel that is gone must not block forever

    def send(command, frames, flags=0):
        socket.send_multipart(head + [protocol[command]] + frames, flags)

    socket.connect(broker)
    send("ready", [service.encode()])
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    parent = os.getppid()
    while running and os.getppid() == parent:  # a test that crashed leaves no worker behind
        if poller.poll(100):
            frames = socket.recv_multipart()
            if frames[:len(head)] != head:
                fail(1, "bad header: %r" % frames[:len(head)])
            command, rest = frames[len(head)], frames[len(head) + 1:]
            if command == protocol["request"]:  # client address, empty, body
                if len(rest) < 3 or rest[1] != b"":
                    fail(1, "bad REQUEST: %r" % rest)
                answer(send, context, socket, rest[0], rest[2:])
            elif command == protocol["disconnect"]:
                os._exit(0)
        if running:
            try:
                send("heartbeat", [], zmq.DONTWAIT)  # dropped when it cannot go now
            except zmq.Again:
                pass
    leave(context, socket, 0, head + [protocol["disconnect"]])


def worker(broker, service):
    def echo(send, context, socket, client, body):
        send("final", [client, b""] + body)

    serve(broker, service, "0.1", echo)


def client(broker, service, body):
    context = zmq.Context()
    socket = context.socket(zmq.REQ)  # REQ adds and strips frame 0 itself
    socket.linger = 0
    socket.rcvtimeo = TIMEOUT_MS
    secure(socket)
    socket.connect(broker)
    socket.send_multipart([b"MDPC01", service.encode(), body.encode()])
    try:
        frames = socket.recv_multipart()
    except zmq.Again:
        fail(2, "no reply")
    if frames[0] != b"MDPC01" or frames[1] != service.encode():
        fail(1, "bad reply header: %r" % frames[:2])
    for frame in frames[2:]:
        print(frame.decode())


def worker02(broker, service, parts, die):
    def stream(send, context, socket, client, body):
        for index in range(1, parts + 1):
            send("partial", [client, b"", b"part-%d" % index])
        if die:
            leave(context, socket, 3, linger=5000)  # the parts go out, the FINAL never does
        send("final", [client, b""] + body)

    serve(broker, service, "0.2", stream)


def client02(broker, service, body):
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)  # 18/MDP: a DEALER, and no empty frame
    socket.linger = 0
    socket.rcvtimeo = TIMEOUT_MS
    secure(socket)
    socket.connect(broker)
    socket.send_multipart([b"MDPC02", b"\x01", service.encode(), body.encode()])
    while True:
        try:
            frames = socket.recv_multipart()
        except zmq.Again:
            fail(2, "no FINAL")
        if frames[0] != b"MDPC02" or frames[1] not in (b"\x02", b"\x03") or frames[2] != service.encode():
            fail(1, "bad reply header: %r" % frames[:3])
        final = frames[1] == b"\x03"
        print(json.dumps({"final": final, "body": [frame.decode() for frame in frames[3:]]}), flush=True)
        if final:
            return


def subscribe(snapshot_endpoint, publisher_endpoint, subtree, count):
    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.linger = 0
    subscriber.rcvtimeo = TIMEOUT_MS
    subscriber.setsockopt(zmq.SUBSCRIBE, subtree.encode())
    subscriber.setsockopt(zmq.SUBSCRIBE, b"HUGZ")
    secure(subscriber)
    subscriber.connect(publisher_endpoint)
    # Wait for a HUGZ: the subscription is live from then on.
    try:
        while subscriber.recv_multipart()[0] != b"HUGZ":
            pass
    except zmq.Again:
        fail(2, "no HUGZ")
    snapshot = context.socket(zmq.DEALER)
    snapshot.linger = 0
    snapshot.rcvtimeo = TIMEOUT_MS
    secure(snapshot)
    snapshot.connect(snapshot_endpoint)
    snapshot.send_multipart([b"ICANHAZ?", subtree.encode()])
    while True:
        try:
            key, sequence, _, _, value = snapshot.recv_multipart()
        except zmq.Again:
            fail(2, "snapshot incomplete")
        sequence = int.from_bytes(sequence, "big")
        if key == b"KTHXBAI":
            last = sequence
            break
        print(json.dumps({"key": key.decode(), "sequence": sequence, "value": value.decode(), "snapshot": True}), flush=True)
    seen = 0
    while seen < count:
        try:
            key, sequence, _, properties, value = subscriber.recv_multipart()
        except zmq.Again:
            fail(2, "no update")
        if key == b"HUGZ":
            continue
        sequence = int.from_bytes(sequence, "big")
        if sequence <= last:
            continue
        last = sequence
        seen += 1
        print(json.dumps({"key": key.decode(), "sequence": sequence, "value": value.decode(), "snapshot": False}), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "worker" and len(sys.argv) == 4:
        worker(sys.argv[2], sys.argv[3])
    elif mode == "client" and len(sys.argv) == 5:
        client(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "worker02" and len(sys.argv) in (5, 6):
        worker02(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:] == ["die"])
    elif mode == "client02" and len(sys.argv) == 5:
        client02(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "subscribe" and len(sys.argv) == 6:
        subscribe(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        fail(64, __doc__)
