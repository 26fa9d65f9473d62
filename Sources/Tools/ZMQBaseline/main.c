// zmq-baseline: the metal the kernel is measured against, in plain C on libzmq.
//
//   zmq-baseline broker FRONT BACK                      ROUTER front, ROUTER back, no protocol
//   zmq-baseline worker BACK SOCKETS                    echo worker for that broker
//   zmq-baseline mdp-broker ENDPOINT SERVICE            the kernel's 7/MDP frames in C: one
//                                                       service, workers with windows, no
//                                                       heartbeats, no bookkeeping
//   zmq-baseline mdp-worker BROKER SERVICE SOCKETS [WINDOW]  7/MDP echo worker (for the kernel);
//                                                       WINDOW > 1 offers that many requests in
//                                                       flight per socket (Switchboard extension)
//   zmq-baseline client ENDPOINT CLIENTS REQUESTS WINDOW            pipelining clients (raw)
//   zmq-baseline mdp-client ENDPOINT SERVICE CLIENTS REQUESTS WINDOW  the same over 7/MDP
//
//   zmq-baseline pubsub-proxy FRONT BACK                XSUB front, XPUB back (zmq_proxy): the
//                                                       metal for the kernel's CHP fan-out
//   zmq-baseline chp-pub ENDPOINT PREFIX COUNT          PUB: COUNT 12/CHP KVSETs (64-byte values,
//                                                       1,000 keys under PREFIX), then exits
//   zmq-baseline chp-sub ENDPOINT PREFIX COUNT          SUB: counts COUNT updates under PREFIX and
//                                                       prints "RATE GAPS MISSING" (sequence frame
//                                                       checked; MISSING never came within 30 s)
//
//   zmq-baseline stream-server ENDPOINT PARTS SIZE      ROUTER: answers each request with PARTS
//                                                       messages of SIZE bytes, then "END": the
//                                                       metal for a reply in parts
//   zmq-baseline mdp02-stream-worker BROKER SERVICE PARTS SIZE  the same as an 18/MDP worker:
//                                                       PARTS PARTIALs, then a FINAL "END"
//   zmq-baseline stream-client ENDPOINT SERVICE|- ROUNDS  one request at a time (18/MDP to
//                                                       SERVICE, or raw with -), ROUNDS times:
//                                                       prints "FIRST_PART_US PARTS_PER_S END_US"
//                                                       (the median time to the first part, parts
//                                                       per second over every round, the median
//                                                       time to the end)
//   zmq-baseline gather-client ENDPOINTS ROUNDS         a ROUTER connected to each of the
//                                                       comma-separated stream-servers: sends one
//                                                       request to each and waits for every "END",
//                                                       ROUNDS times; prints the median round in µs
//
// Brokers, proxies and workers run until their standard input ends (the lifeline: the benchmark
// holds the other end of the pipe) or they get SIGTERM. Clients send REQUESTS 64-byte
// bodies in all, each client keeping WINDOW in flight on its own DEALER and thread, then
// print the rate (requests per second) on stdout. Frames are moved, never copied.
#include <zmq.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "zmq-baseline: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

static void *socket_of(void *context, int type) {
    void *socket = zmq_socket(context, type);
    if (!socket) die("zmq_socket");
    int zero = 0;
    zmq_setsockopt(socket, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(socket, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof zero);
    return socket;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

// A whole multipart message, frame by frame, as libzmq handed it over.
#define MAX_PARTS 16
typedef struct {
    zmq_msg_t parts[MAX_PARTS];
    int count;
} message_t;

// Receives one message; 0 on EAGAIN (with ZMQ_DONTWAIT), -1 on error.
static int receive(void *socket, message_t *message, int flags) {
    message->count = 0;
    int more = 1;
    while (more) {
        if (message->count == MAX_PARTS) die("a message with too many parts");
        zmq_msg_t *part = &message->parts[message->count];
        zmq_msg_init(part);
        if (zmq_msg_recv(part, socket, message->count == 0 ? flags : 0) == -1) {
            zmq_msg_close(part);
            if (zmq_errno() == EAGAIN && message->count == 0) return 0;
            return -1;
        }
        message->count++;
        more = zmq_msg_more(part);
    }
    return 1;
}

// Sends parts [from, count) of a message, moving them.
static void send_from(void *socket, message_t *message, int from) {
    for (int index = from; index < message->count; index++) {
        int flags = index + 1 < message->count ? ZMQ_SNDMORE : 0;
        if (zmq_msg_send(&message->parts[index], socket, flags) == -1) die("zmq_msg_send");
    }
    for (int index = 0; index < from; index++) zmq_msg_close(&message->parts[index]);
}

static void send_text(void *socket, const void *data, size_t size, int flags) {
    if (zmq_send(socket, data, size, flags) == -1) die("zmq_send");
}

// True when the lifeline (standard input) has ended. A pipe whose writer is gone polls as
// hung up, which zmq_poll reports as ZMQ_POLLERR.
static int lifeline_ended(zmq_pollitem_t *item) {
    if (!(item->revents & (ZMQ_POLLIN | ZMQ_POLLERR))) return 0;
    char buffer[64];
    return read(0, buffer, sizeof buffer) <= 0;
}

// Polls ITEMS (the last is the lifeline): 1 when something is ready, 0 to poll again (a
// signal), -1 when the lifeline ended.
static int poll_with_lifeline(zmq_pollitem_t *items, int count) {
    if (zmq_poll(items, count, -1) == -1) {
        if (zmq_errno() == EINTR) return 0;
        die("zmq_poll");
    }
    return lifeline_ended(&items[count - 1]) ? -1 : 1;
}

// For a process that blocks in libzmq (zmq_proxy): ends it when the lifeline ends.
static void *watch_lifeline(void *unused) {
    (void)unused;
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0) {}
    exit(0);
}

// MARK: The raw broker: clients' requests to workers round-robin, replies back.

static int broker(const char *front_endpoint, const char *back_endpoint) {
    void *context = zmq_ctx_new();
    void *front = socket_of(context, ZMQ_ROUTER), *back = socket_of(context, ZMQ_ROUTER);
    if (zmq_bind(front, front_endpoint) == -1) die(front_endpoint);
    if (zmq_bind(back, back_endpoint) == -1) die(back_endpoint);
    zmq_msg_t workers[1024];
    int worker_count = 0, next = 0;
    zmq_pollitem_t items[] = {{front, 0, ZMQ_POLLIN, 0}, {back, 0, ZMQ_POLLIN, 0}, {NULL, 0, ZMQ_POLLIN, 0}};
    message_t message;
    while (1) {
        // Until a worker is there, requests wait in libzmq.
        int ready = poll_with_lifeline(worker_count ? items : items + 1, worker_count ? 3 : 2);
        if (ready < 0) break;
        if (ready == 0) continue;
        // Drain each socket in batches before sleeping again.
        for (int batch = 0; batch < 1000 && receive(back, &message, ZMQ_DONTWAIT) == 1; batch++) {
            if (message.count == 2 && zmq_msg_size(&message.parts[1]) == 5 && memcmp(zmq_msg_data(&message.parts[1]), "READY", 5) == 0) {
                if (worker_count == 1024) die("too many workers");
                zmq_msg_init(&workers[worker_count]);
                zmq_msg_copy(&workers[worker_count++], &message.parts[0]);
                zmq_msg_close(&message.parts[0]);
                zmq_msg_close(&message.parts[1]);
                continue;
            }
            send_from(front, &message, 1);  // [worker, client, "", body] -> [client, "", body]
        }
        for (int batch = 0; worker_count && batch < 1000 && receive(front, &message, ZMQ_DONTWAIT) == 1; batch++) {
            zmq_msg_t worker;
            zmq_msg_init(&worker);
            zmq_msg_copy(&worker, &workers[next]);
            next = (next + 1) % worker_count;
            if (zmq_msg_send(&worker, back, ZMQ_SNDMORE) == -1) die("zmq_msg_send");
            send_from(back, &message, 0);
        }
    }
    return 0;
}

// MARK: A minimal 7/MDP broker: the frames the kernel moves, and nothing else

#define MDP_QUEUE 8192
static message_t mdp_queue[MDP_QUEUE];

static void send_part(void *socket, zmq_msg_t *part, int flags) {
    if (zmq_msg_send(part, socket, flags) == -1) die("zmq_msg_send");
}

// [client, "", MDPC01, service, body...] to a worker as [worker, "", MDPW01, 0x02, client, "", body...].
static void mdp_dispatch(void *router, zmq_msg_t *worker, message_t *request) {
    zmq_msg_t identity;
    zmq_msg_init(&identity);
    zmq_msg_copy(&identity, worker);
    send_part(router, &identity, ZMQ_SNDMORE);
    send_text(router, "", 0, ZMQ_SNDMORE);
    send_text(router, "MDPW01", 6, ZMQ_SNDMORE);
    send_text(router, "\x02", 1, ZMQ_SNDMORE);
    send_part(router, &request->parts[0], ZMQ_SNDMORE);
    send_part(router, &request->parts[1], ZMQ_SNDMORE);
    zmq_msg_close(&request->parts[2]);
    zmq_msg_close(&request->parts[3]);
    for (int index = 4; index < request->count; index++)
        send_part(router, &request->parts[index], index + 1 < request->count ? ZMQ_SNDMORE : 0);
}

static int mdp_broker(const char *endpoint, const char *service) {
    void *context = zmq_ctx_new();
    void *router = socket_of(context, ZMQ_ROUTER);
    if (zmq_bind(router, endpoint) == -1) die(endpoint);
    zmq_msg_t workers[64];
    int credits[64], worker_count = 0, next = 0;
    long queued = 0, head = 0;
    zmq_pollitem_t items[] = {{router, 0, ZMQ_POLLIN, 0}, {NULL, 0, ZMQ_POLLIN, 0}};
    message_t message;
    while (1) {
        int ready = poll_with_lifeline(items, 2);
        if (ready < 0) break;
        if (ready == 0) continue;
        for (int batch = 0; batch < 1000 && receive(router, &message, ZMQ_DONTWAIT) == 1; batch++) {
            int worker_message = message.count >= 4 && zmq_msg_size(&message.parts[2]) == 6 &&
                                 memcmp(zmq_msg_data(&message.parts[2]), "MDPW01", 6) == 0;
            if (!worker_message) {
                if (message.count < 5) die("a short request");
                if (queued == MDP_QUEUE) die("the request queue is full");
                message_t *slot = &mdp_queue[(head + queued++) % MDP_QUEUE];
                slot->count = message.count;
                for (int index = 0; index < message.count; index++) {
                    zmq_msg_init(&slot->parts[index]);
                    zmq_msg_move(&slot->parts[index], &message.parts[index]);
                }
            } else {
                char command = *(char *)zmq_msg_data(&message.parts[3]);
                int sender = -1;
                for (int index = 0; index < worker_count; index++) {
                    if (zmq_msg_size(&workers[index]) == zmq_msg_size(&message.parts[0]) &&
                        memcmp(zmq_msg_data(&workers[index]), zmq_msg_data(&message.parts[0]), zmq_msg_size(&message.parts[0])) == 0) sender = index;
                }
                if (command == 0x01 && sender < 0 && worker_count < 64) {
                    zmq_msg_init(&workers[worker_count]);
                    zmq_msg_copy(&workers[worker_count], &message.parts[0]);
                    char offer[32] = {0};
                    if (message.count == 6) memcpy(offer, zmq_msg_data(&message.parts[5]), zmq_msg_size(&message.parts[5]) < 31 ? zmq_msg_size(&message.parts[5]) : 31);
                    credits[worker_count++] = message.count == 6 ? atoi(offer + 7) : 1;
                } else if (command == 0x03 && sender >= 0 && message.count >= 7) {
                    // [worker, "", MDPW01, 0x03, client, "", body...] to [client, "", MDPC01, service, body...]
                    credits[sender]++;
                    send_part(router, &message.parts[4], ZMQ_SNDMORE);
                    send_part(router, &message.parts[5], ZMQ_SNDMORE);
                    send_text(router, "MDPC01", 6, ZMQ_SNDMORE);
                    send_text(router, service, strlen(service), ZMQ_SNDMORE);
                    for (int index = 6; index < message.count; index++)
                        send_part(router, &message.parts[index], index + 1 < message.count ? ZMQ_SNDMORE : 0);
                    for (int index = 0; index < 4; index++) zmq_msg_close(&message.parts[index]);
                } else {
                    for (int index = 0; index < message.count; index++) zmq_msg_close(&message.parts[index]);
                }
            }
            // Hand queued requests to workers with room, round robin.
            for (int tries = 0; queued > 0 && tries < worker_count;) {
                if (credits[next] > 0) {
                    credits[next]--;
                    mdp_dispatch(router, &workers[next], &mdp_queue[head]);
                    head = (head + 1) % MDP_QUEUE;
                    queued--;
                    tries = 0;
                } else {
                    tries++;
                }
                next = (next + 1) % worker_count;
            }
        }
    }
    return 0;
}

// MARK: Echo workers

static int worker(const char *endpoint, const char *service, int count, int window) {
    void *context = zmq_ctx_new();
    void **sockets = calloc((size_t)count, sizeof(void *));
    zmq_pollitem_t *items = calloc((size_t)count + 1, sizeof(zmq_pollitem_t));
    for (int index = 0; index < count; index++) {
        sockets[index] = socket_of(context, ZMQ_DEALER);
        if (zmq_connect(sockets[index], endpoint) == -1) die(endpoint);
        if (service) {
            send_text(sockets[index], "", 0, ZMQ_SNDMORE);
            send_text(sockets[index], "MDPW01", 6, ZMQ_SNDMORE);
            send_text(sockets[index], "\x01", 1, ZMQ_SNDMORE);
            if (window > 1) {
                char offer[32];
                int length = snprintf(offer, sizeof offer, "window=%d", window);
                send_text(sockets[index], service, strlen(service), ZMQ_SNDMORE);
                send_text(sockets[index], offer, (size_t)length, 0);
            } else {
                send_text(sockets[index], service, strlen(service), 0);
            }
        } else {
            send_text(sockets[index], "READY", 5, 0);
        }
        items[index] = (zmq_pollitem_t){sockets[index], 0, ZMQ_POLLIN, 0};
    }
    items[count] = (zmq_pollitem_t){NULL, 0, ZMQ_POLLIN, 0};
    message_t message;
    while (1) {
        int ready = poll_with_lifeline(items, count + 1);
        if (ready < 0) break;
        if (ready == 0) continue;
        for (int index = 0; index < count; index++) {
            if (!(items[index].revents & ZMQ_POLLIN)) continue;
            while (receive(sockets[index], &message, ZMQ_DONTWAIT) == 1) {
                if (!service) {
                    send_from(sockets[index], &message, 0);  // [client, "", body] back as it came
                    continue;
                }
                // 7/MDP: ["", MDPW01, command, ...]; REQUEST [.., 0x02, client, "", body].
                char command = message.count >= 3 ? *(char *)zmq_msg_data(&message.parts[2]) : 0;
                if (command == 0x02 && message.count >= 6) {
                    zmq_msg_t reply;
                    zmq_msg_init_size(&reply, 1);
                    *(char *)zmq_msg_data(&reply) = 0x03;
                    zmq_msg_close(&message.parts[2]);
                    message.parts[2] = reply;
                    send_from(sockets[index], &message, 0);
                } else {
                    if (command == 0x04) {  // HEARTBEAT: answer in kind, so an idle worker stays registered
                        send_text(sockets[index], "", 0, ZMQ_SNDMORE);
                        send_text(sockets[index], "MDPW01", 6, ZMQ_SNDMORE);
                        send_text(sockets[index], "\x04", 1, 0);
                    }
                    for (int part = 0; part < message.count; part++) zmq_msg_close(&message.parts[part]);
                }
            }
        }
    }
    return 0;
}

// MARK: Publish-subscribe, for the CHP rows

static int pubsub_proxy(const char *front_endpoint, const char *back_endpoint) {
    void *context = zmq_ctx_new();
    void *front = socket_of(context, ZMQ_XSUB), *back = socket_of(context, ZMQ_XPUB);
    if (zmq_bind(front, front_endpoint) == -1) die(front_endpoint);
    if (zmq_bind(back, back_endpoint) == -1) die(back_endpoint);
    // The proxy runs until the process ends: the benchmark ends it with its lifeline, which a
    // thread watches here.
    pthread_t watcher;
    pthread_create(&watcher, NULL, watch_lifeline, NULL);
    zmq_proxy(front, back, NULL);
    return 0;
}

static int chp_pub(const char *endpoint, const char *prefix, long count) {
    void *context = zmq_ctx_new();
    void *socket = socket_of(context, ZMQ_PUB);
    int forever = -1;
    zmq_setsockopt(socket, ZMQ_LINGER, &forever, sizeof forever);  // deliver everything before exiting
    if (zmq_connect(socket, endpoint) == -1) die(endpoint);
    usleep(500000);  // PUB/SUB joins are not acknowledged: let the link and subscriptions settle
    char value[64], key[256];
    memset(value, 0x41, sizeof value);
    unsigned char sequence[8] = {0};
    for (long index = 0; index < count; index++) {
        int length = snprintf(key, sizeof key, "%s%ld", prefix, index % 1000);
        send_text(socket, key, (size_t)length, ZMQ_SNDMORE);
        send_text(socket, sequence, sizeof sequence, ZMQ_SNDMORE);
        send_text(socket, "", 0, ZMQ_SNDMORE);
        send_text(socket, "", 0, ZMQ_SNDMORE);
        send_text(socket, value, sizeof value, 0);
    }
    zmq_close(socket);
    zmq_ctx_term(context);
    return 0;
}

static int chp_sub(const char *endpoint, const char *prefix, long count) {
    void *context = zmq_ctx_new();
    void *socket = socket_of(context, ZMQ_SUB);
    int timeout = 30000;
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(socket, ZMQ_SUBSCRIBE, prefix, strlen(prefix));
    if (zmq_connect(socket, endpoint) == -1) die(endpoint);
    message_t message;
    long seen = 0, gaps = 0;
    unsigned long long last = 0;
    double start = 0, latest = 0;
    while (seen < count) {
        if (receive(socket, &message, 0) != 1) break;
        latest = now();
        if (message.count >= 2 && zmq_msg_size(&message.parts[1]) == 8) {
            const unsigned char *bytes = zmq_msg_data(&message.parts[1]);
            unsigned long long sequence = 0;
            for (int index = 0; index < 8; index++) sequence = sequence << 8 | bytes[index];
            // The raw proxy forwards the publisher's zero sequences; the kernel numbers them.
            if (sequence != 0 && last != 0 && sequence != last + 1) gaps++;
            last = sequence;
        }
        if (seen++ == 0) start = now();
        for (int part = 0; part < message.count; part++) zmq_msg_close(&message.parts[part]);
    }
    // Updates the publisher sent that never came (a PUB drops what its peer's queue cannot
    // take): the rate is over what came, and the shortfall is the third figure.
    if (seen < 2) {
        fprintf(stderr, "zmq-baseline: %ld of %ld updates within 30 s\n", seen, count);
        return 1;
    }
    double seconds = latest - start;
    printf("%.0f %ld %ld\n", (double)(seen - 1) / seconds, gaps, count - seen);
    zmq_close(socket);
    zmq_ctx_term(context);
    return 0;
}

// MARK: Pipelining clients

typedef struct {
    void *context;
    const char *endpoint, *service;
    long requests, window;
    int failed;
} client_t;

static void *run_client(void *argument) {
    client_t *client = argument;
    void *socket = socket_of(client->context, ZMQ_DEALER);
    int timeout = 30000;
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_connect(socket, client->endpoint) == -1) die(client->endpoint);
    char body[64];
    memset(body, 0x5A, sizeof body);
    long sent = 0, received = 0;
    message_t reply;
    while (received < client->requests) {
        while (sent < client->requests && sent - received < client->window) {
            send_text(socket, "", 0, ZMQ_SNDMORE);
            if (client->service) {
                send_text(socket, "MDPC01", 6, ZMQ_SNDMORE);
                send_text(socket, client->service, strlen(client->service), ZMQ_SNDMORE);
            }
            send_text(socket, body, sizeof body, 0);
            sent++;
        }
        if (receive(socket, &reply, 0) != 1) {
            client->failed = 1;
            break;
        }
        for (int part = 0; part < reply.count; part++) zmq_msg_close(&reply.parts[part]);
        received++;
    }
    zmq_close(socket);
    return NULL;
}

static int clients(const char *endpoint, const char *service, int count, long requests, long window) {
    void *context = zmq_ctx_new();
    client_t *all = calloc((size_t)count, sizeof(client_t));
    pthread_t *threads = calloc((size_t)count, sizeof(pthread_t));
    double start = now();
    for (int index = 0; index < count; index++) {
        all[index] = (client_t){context, endpoint, service, requests / count, window, 0};
        pthread_create(&threads[index], NULL, run_client, &all[index]);
    }
    int failed = 0;
    for (int index = 0; index < count; index++) {
        pthread_join(threads[index], NULL);
        failed |= all[index].failed;
    }
    double seconds = now() - start;
    if (failed) {
        fprintf(stderr, "zmq-baseline: a client got no reply within 30 s\n");
        return 1;
    }
    printf("%.0f\n", (double)(requests / count * count) / seconds);
    zmq_ctx_term(context);
    return 0;
}

// MARK: Replies in parts, for the stream rows

static int stream_server(const char *endpoint, const char *service, long parts, size_t size) {
    void *context = zmq_ctx_new();
    void *socket = socket_of(context, service ? ZMQ_DEALER : ZMQ_ROUTER);
    if ((service ? zmq_connect(socket, endpoint) : zmq_bind(socket, endpoint)) == -1) die(endpoint);
    if (service) {
        send_text(socket, "MDPW02", 6, ZMQ_SNDMORE);
        send_text(socket, "\x01", 1, ZMQ_SNDMORE);
        send_text(socket, service, strlen(service), 0);
    }
    char *body = malloc(size);
    memset(body, 0x5A, size);
    zmq_pollitem_t items[2] = {{socket, 0, ZMQ_POLLIN, 0}, {NULL, 0, ZMQ_POLLIN, 0}};
    message_t message;
    while (1) {
        int ready = poll_with_lifeline(items, 2);
        if (ready < 0) break;
        if (ready == 0) continue;
        while (receive(socket, &message, ZMQ_DONTWAIT) == 1) {
            if (service) {
                // 18/MDP: [MDPW02, command, ...]; REQUEST [MDPW02, 0x02, client, "", body].
                char command = message.count >= 2 ? *(char *)zmq_msg_data(&message.parts[1]) : 0;
                if (command == 0x05) {  // HEARTBEAT, answered in kind
                    send_text(socket, "MDPW02", 6, ZMQ_SNDMORE);
                    send_text(socket, "\x05", 1, 0);
                }
                if (command == 0x02 && message.count >= 5) {
                    zmq_msg_t *client = &message.parts[2];
                    for (long part = 0; part <= parts; part++) {
                        send_text(socket, "MDPW02", 6, ZMQ_SNDMORE);
                        send_text(socket, part < parts ? "\x03" : "\x04", 1, ZMQ_SNDMORE);
                        send_text(socket, zmq_msg_data(client), zmq_msg_size(client), ZMQ_SNDMORE);
                        send_text(socket, "", 0, ZMQ_SNDMORE);
                        if (part < parts) send_text(socket, body, size, 0); else send_text(socket, "END", 3, 0);
                    }
                }
            } else {
                // Raw: [client, body].
                zmq_msg_t *client = &message.parts[0];
                for (long part = 0; part <= parts; part++) {
                    send_text(socket, zmq_msg_data(client), zmq_msg_size(client), ZMQ_SNDMORE);
                    if (part < parts) send_text(socket, body, size, 0); else send_text(socket, "END", 3, 0);
                }
            }
            for (int index = 0; index < message.count; index++) zmq_msg_close(&message.parts[index]);
        }
    }
    return 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int stream_client(const char *endpoint, const char *service, int rounds) {
    void *context = zmq_ctx_new();
    void *socket = socket_of(context, ZMQ_DEALER);
    int timeout = 30000;
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_connect(socket, endpoint) == -1) die(endpoint);
    double *firsts = calloc((size_t)rounds, sizeof(double));
    double *ends = calloc((size_t)rounds, sizeof(double));
    double streaming = 0;
    long received = 0;
    message_t reply;
    for (int round = 0; round < rounds; round++) {
        double start = now();
        if (service) {
            send_text(socket, "MDPC02", 6, ZMQ_SNDMORE);
            send_text(socket, "\x01", 1, ZMQ_SNDMORE);
            send_text(socket, service, strlen(service), ZMQ_SNDMORE);
        }
        send_text(socket, "go", 2, 0);
        int first = 1, done = 0;
        while (!done) {
            if (receive(socket, &reply, 0) != 1) {
                fprintf(stderr, "zmq-baseline: no part within 30 s\n");
                return 1;
            }
            if (service) done = reply.count >= 2 && *(char *)zmq_msg_data(&reply.parts[1]) == 0x03;
            else done = zmq_msg_size(&reply.parts[0]) == 3 && !memcmp(zmq_msg_data(&reply.parts[0]), "END", 3);
            if (!done) received++;
            if (first) {
                firsts[round] = now() - start;
                first = 0;
            }
            for (int part = 0; part < reply.count; part++) zmq_msg_close(&reply.parts[part]);
        }
        ends[round] = now() - start;
        streaming += ends[round];
    }
    qsort(firsts, (size_t)rounds, sizeof(double), compare_doubles);
    qsort(ends, (size_t)rounds, sizeof(double), compare_doubles);
    printf("%.1f %.0f %.1f\n", firsts[rounds / 2] * 1e6, (double)received / streaming, ends[rounds / 2] * 1e6);
    zmq_close(socket);
    zmq_ctx_term(context);
    return 0;
}

static int gather_client(char *endpoints, int rounds) {
    void *context = zmq_ctx_new();
    void *socket = socket_of(context, ZMQ_ROUTER);
    int one = 1, timeout = 30000;
    zmq_setsockopt(socket, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    int count = 0;
    for (char *endpoint = strtok(endpoints, ","); endpoint; endpoint = strtok(NULL, ","), count++) {
        char name[16];
        int length = snprintf(name, sizeof name, "w%d", count);
        zmq_setsockopt(socket, ZMQ_CONNECT_ROUTING_ID, name, (size_t)length);
        if (zmq_connect(socket, endpoint) == -1) die(endpoint);
    }
    double *times = calloc((size_t)rounds, sizeof(double));
    message_t reply;
    for (int round = -1; round < rounds; round++) {  // round -1: until every connection takes a send
        double start = now();
        for (int index = 0; index < count; index++) {
            char name[16];
            int length = snprintf(name, sizeof name, "w%d", index);
            while (zmq_send(socket, name, (size_t)length, ZMQ_SNDMORE) == -1) {
                if (zmq_errno() != EHOSTUNREACH || round >= 0) die("zmq_send");
                usleep(1000);
            }
            send_text(socket, "go", 2, 0);
        }
        for (int answers = 0; answers < count;) {
            if (receive(socket, &reply, 0) != 1) {
                fprintf(stderr, "zmq-baseline: no answer within 30 s\n");
                return 1;
            }
            int end = reply.count == 2 && zmq_msg_size(&reply.parts[1]) == 3 && !memcmp(zmq_msg_data(&reply.parts[1]), "END", 3);
            answers += end;
            for (int part = 0; part < reply.count; part++) zmq_msg_close(&reply.parts[part]);
        }
        if (round >= 0) times[round] = now() - start;
    }
    qsort(times, (size_t)rounds, sizeof(double), compare_doubles);
    printf("%.1f\n", times[rounds / 2] * 1e6);
    zmq_close(socket);
    zmq_ctx_term(context);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "broker") && argc == 4) return broker(argv[2], argv[3]);
    if (!strcmp(mode, "pubsub-proxy") && argc == 4) return pubsub_proxy(argv[2], argv[3]);
    if (!strcmp(mode, "chp-pub") && argc == 5) return chp_pub(argv[2], argv[3], atol(argv[4]));
    if (!strcmp(mode, "chp-sub") && argc == 5) return chp_sub(argv[2], argv[3], atol(argv[4]));
    if (!strcmp(mode, "mdp-broker") && argc == 4) return mdp_broker(argv[2], argv[3]);
    if (!strcmp(mode, "worker") && argc == 4) return worker(argv[2], NULL, atoi(argv[3]), 1);
    if (!strcmp(mode, "mdp-worker") && (argc == 5 || argc == 6)) return worker(argv[2], argv[3], atoi(argv[4]), argc == 6 ? atoi(argv[5]) : 1);
    if (!strcmp(mode, "client") && argc == 6) return clients(argv[2], NULL, atoi(argv[3]), atol(argv[4]), atol(argv[5]));
    if (!strcmp(mode, "mdp-client") && argc == 7) return clients(argv[2], argv[3], atoi(argv[4]), atol(argv[5]), atol(argv[6]));
    if (!strcmp(mode, "stream-server") && argc == 5) return stream_server(argv[2], NULL, atol(argv[3]), (size_t)atol(argv[4]));
    if (!strcmp(mode, "mdp02-stream-worker") && argc == 6) return stream_server(argv[2], argv[3], atol(argv[4]), (size_t)atol(argv[5]));
    if (!strcmp(mode, "gather-client") && argc == 4) return gather_client(argv[2], atoi(argv[3]));
    if (!strcmp(mode, "stream-client") && argc == 5) return stream_client(argv[2], strcmp(argv[3], "-") ? argv[3] : NULL, atoi(argv[4]));
    fprintf(stderr,
            "usage: zmq-baseline broker FRONT BACK | mdp-broker ENDPOINT SERVICE | worker BACK SOCKETS | mdp-worker BROKER SERVICE SOCKETS [WINDOW]\n"
            "       | client ENDPOINT CLIENTS REQUESTS WINDOW | mdp-client ENDPOINT SERVICE CLIENTS REQUESTS WINDOW\n"
            "       | pubsub-proxy FRONT BACK | chp-pub ENDPOINT PREFIX COUNT | chp-sub ENDPOINT PREFIX COUNT\n"
            "       | stream-server ENDPOINT PARTS SIZE | mdp02-stream-worker BROKER SERVICE PARTS SIZE | stream-client ENDPOINT SERVICE|- ROUNDS\n"
            "       | gather-client ENDPOINT,ENDPOINT,... ROUNDS\n");
    return 64;
}
