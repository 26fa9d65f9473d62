// nats-baseline: what a team would pick instead of the bus, measured beside it: request/reply
// through nats-server with C ends on libnats (Debian's libnats-dev).
//
//   nats-baseline responder URL SUBJECT asap|buffered  answers each request on SUBJECT with its
//                                                      body (each answer sent at once, or left
//                                                      to libnats's flusher, which gathers
//                                                      them), until its standard input ends
//                                                      (the lifeline) or it gets SIGTERM
//   nats-baseline requester URL SUBJECT COUNT WINDOW asap|buffered
//                                                      sends COUNT 64-byte requests keeping
//                                                      WINDOW in flight, after 1,000 to warm up;
//                                                      prints "RATE P50_US" (requests a second;
//                                                      with WINDOW 1, each by natsConnection_Request,
//                                                      and the median round trip)
//
// Not a SwiftPM target: libnats is a benchmark's dependency, not the bus's. Scripts/bench
// installs it and compiles this file next to the release build:
//   cc -O2 -o .build/release/nats-baseline Sources/Tools/NATSBaseline/nats_baseline.c -lnats -lpthread
#include <nats/nats.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void check(natsStatus status, const char *what) {
    if (status == NATS_OK) return;
    fprintf(stderr, "nats-baseline: %s: %s\n", what, natsStatus_GetText(status));
    exit(1);
}

static double seconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static natsConnection *connect_to(const char *url, bool send_asap) {
    natsOptions *options = NULL;
    check(natsOptions_Create(&options), "options");
    check(natsOptions_SetURL(options, url), "url");
    check(natsOptions_SetSendAsap(options, send_asap), "send asap");
    natsConnection *connection = NULL;
    // The server may still be starting: a few tries.
    natsStatus status = NATS_ERR;
    for (int attempt = 0; attempt < 100 && status != NATS_OK; attempt++) {
        status = natsConnection_Connect(&connection, options);
        if (status != NATS_OK) usleep(50000);
    }
    check(status, url);
    natsOptions_Destroy(options);
    return connection;
}

// Ends the process when the lifeline (standard input) ends.
static void *watch_lifeline(void *unused) {
    (void)unused;
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0) {}
    exit(0);
}

static void answer(natsConnection *connection, natsSubscription *subscription, natsMsg *message, void *unused) {
    (void)subscription;
    (void)unused;
    const char *reply = natsMsg_GetReply(message);
    if (reply != NULL) natsConnection_Publish(connection, reply, natsMsg_GetData(message), natsMsg_GetDataLength(message));
    natsMsg_Destroy(message);
}

static int responder(const char *url, const char *subject, bool send_asap) {
    natsConnection *connection = connect_to(url, send_asap);
    natsSubscription *subscription = NULL;
    check(natsConnection_Subscribe(&subscription, connection, subject, answer, NULL), "subscribe");
    check(natsSubscription_SetPendingLimits(subscription, -1, -1), "pending limits");
    check(natsConnection_Flush(connection), "flush");
    pthread_t lifeline;
    pthread_create(&lifeline, NULL, watch_lifeline, NULL);
    for (;;) pause();
    return 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Sends COUNT requests keeping WINDOW in flight on one inbox (WINDOW 1: one request at a
// time, as natsConnection_Request sends it); returns the rate, and with WINDOW 1 the median
// round trip in µs.
static double run(natsConnection *connection, natsSubscription *inbox, const char *reply_to, const char *subject,
                  long count, long window, double *p50) {
    char body[64];
    memset(body, 'x', sizeof body);
    double started = seconds_now();
    if (window == 1) {
        double *round_trips = malloc(sizeof(double) * (size_t)count);
        if (round_trips == NULL) {
            fprintf(stderr, "nats-baseline: no memory for %ld round trips\n", count);
            exit(1);
        }
        for (long index = 0; index < count; index++) {
            double sent_at = seconds_now();
            natsMsg *reply = NULL;
            check(natsConnection_Request(&reply, connection, subject, body, sizeof body, 10000), "a reply within 10 s");
            natsMsg_Destroy(reply);
            round_trips[index] = (seconds_now() - sent_at) * 1e6;
        }
        double rate = (double)count / (seconds_now() - started);
        qsort(round_trips, (size_t)count, sizeof(double), compare_doubles);
        *p50 = round_trips[count / 2];
        free(round_trips);
        return rate;
    }
    long sent = 0, received = 0;
    while (sent < count && sent < window) {
        check(natsConnection_PublishRequest(connection, subject, reply_to, body, sizeof body), "request");
        sent++;
    }
    while (received < count) {
        natsMsg *reply = NULL;
        check(natsSubscription_NextMsg(&reply, inbox, 10000), "a reply within 10 s");
        natsMsg_Destroy(reply);
        received++;
        if (sent < count) {
            check(natsConnection_PublishRequest(connection, subject, reply_to, body, sizeof body), "request");
            sent++;
        }
    }
    return (double)count / (seconds_now() - started);
}

static int requester(const char *url, const char *subject, long count, long window, bool send_asap) {
    natsConnection *connection = connect_to(url, send_asap);
    natsInbox *inbox = NULL;
    check(natsInbox_Create(&inbox), "inbox");
    natsSubscription *replies = NULL;
    check(natsConnection_SubscribeSync(&replies, connection, inbox), "subscribe to the inbox");
    check(natsSubscription_SetPendingLimits(replies, -1, -1), "pending limits");
    check(natsConnection_Flush(connection), "flush");
    // The responder subscribes on its own connection: ask until it answers.
    natsMsg *first = NULL;
    natsStatus status = NATS_TIMEOUT;
    for (int attempt = 0; attempt < 100 && status != NATS_OK; attempt++) {
        status = natsConnection_RequestString(&first, connection, subject, "ping", 100);
    }
    check(status, "a first answer from the responder");
    natsMsg_Destroy(first);
    double p50 = 0;
    run(connection, replies, inbox, subject, 1000, window, &p50);
    double rate = run(connection, replies, inbox, subject, count, window, &p50);
    printf("%.1f %.1f\n", rate, p50);
    natsSubscription_Destroy(replies);
    natsInbox_Destroy(inbox);
    natsConnection_Destroy(connection);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "responder") == 0) return responder(argv[2], argv[3], strcmp(argv[4], "asap") == 0);
    if (argc == 7 && strcmp(argv[1], "requester") == 0 && atol(argv[4]) > 0 && atol(argv[5]) > 0) {
        return requester(argv[2], argv[3], atol(argv[4]), atol(argv[5]), strcmp(argv[6], "asap") == 0);
    }
    fprintf(stderr, "usage: nats-baseline responder URL SUBJECT asap|buffered | requester URL SUBJECT COUNT WINDOW asap|buffered\n");
    return 64;
}
