#!/usr/bin/env python3
"""A minimal OTLP/HTTP receiver for the telemetry test.

Accepts POST /v1/traces and /v1/metrics with an ExportTraceServiceRequest or an
ExportMetricsServiceRequest in protobuf (decoded with the official definitions, PyPI's
opentelemetry-proto) and prints one JSON line per span on stdout (service, the resource's
service.name; name, kind, traceId, spanId, parentSpanId, status code, attributes, resource: the
resource's attributes) and one per metric data point (service, metric, attributes, value). The first line is {"listening": PORT}. It ends when its stdin closes (the
test's lifeline), or on SIGTERM.

    otlp_receiver.py [PORT] [CERT KEY [CA]]

PORT 0 or none: any free port on 127.0.0.1. With CERT and KEY (PEM files) it serves HTTPS;
with CA too, only to clients whose certificate CA signed.
"""
import json
import os
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def service_name(resource):
    return next((a.value.string_value for a in resource.attributes if a.key == "service.name"), "")


def points(request):
    for resource_metrics in request.resource_metrics:
        service = service_name(resource_metrics.resource)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                data = metric.sum if metric.HasField("sum") else metric.gauge if metric.HasField("gauge") else None
                if data is None:
                    continue
                for point in data.data_points:
                    yield {
                        "service": service,
                        "metric": metric.name,
                        "attributes": {a.key: a.value.string_value for a in point.attributes},
                        "value": point.as_int if point.HasField("as_int") else point.as_double,
                    }


def spans(request):
    for resource_spans in request.resource_spans:
        service = service_name(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": service,
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "traceId": span.trace_id.hex(),
                    "spanId": span.span_id.hex(),
                    "parentSpanId": span.parent_span_id.hex(),
                    "status": span.status.code,
                    "attributes": {a.key: a.value.string_value or a.value.int_value for a in span.attributes},
                    "resource": {a.key: a.value.string_value for a in resource_spans.resource.attributes},
                }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        kinds = {
            "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse, spans),
            "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse, points),
        }
        if self.path not in kinds or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request_type, response_type, lines = kinds[self.path]
        request = request_type()
        request.ParseFromString(body)
        for line in lines(request):
            print(json.dumps(line), flush=True)
        reply = response_type().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    server = HTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    if len(sys.argv) > 3:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[2], sys.argv[3])
        if len(sys.argv) > 4:
            context.load_verify_locations(sys.argv[4])
            context.verify_mode = ssl.CERT_REQUIRED
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(json.dumps({"listening": server.server_address[1]}), flush=True)

    def lifeline():
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=lifeline, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
