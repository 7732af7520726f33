/*
 * Seed 004's final NAT design (section 3.2.2), rebuilt from the description
 * in its sections 2.3, 3.1.2 and 3.2 and the structures of its appendix B, so
 * that natrix can be compared with it on the same host in the same hour.
 *
 * What it keeps from the seed, as published:
 *  - a 20-byte simulated packet (address, port, checksum, a 2-word L4 part),
 *    no frame, no parsing, no validation;
 *  - outbound: a separately chained hash table of 2^24 heads, keyed by
 *    (low 16 bits of the address) << 16 | port, bucket = key mod 2^24,
 *    chains of malloc'd blocks of three packed 18-byte items (one cache
 *    line), each item holding the key and the index of the translation;
 *  - inbound: a direct-addressed array of translations indexed by external
 *    port (one external address, as many "ports" as flows);
 *  - external ports popped from a malloc'd free list (freed as they go);
 *  - a gettimeofday() timestamp read to check the timeout and written on
 *    every translation, and the Linux ip_fast_csum checksum, recomputed
 *    over the packet after each rewrite.
 *
 * Where it is kinder to the seed than the appendix: the checksum covers the
 * 20-byte packet (the appendix passes 20 as a count of 32-bit words, summing
 * 80 bytes), and it is built with -O3 -march=native.
 *
 * Method (seed section 3.1.2, as natrix bench): N unique flows (uniformly
 * spread over 254 x 254 inside hosts and 15,000 source ports), a "new" pass
 * (each packet opens its flow, then each reply is translated back) and an
 * "established" pass of the same packets; every packet is checked to come
 * back to its original address and port. Generation is not timed. Output:
 * one JSON line per pass, like `natrix bench --json`.
 *
 *   cc -O3 -march=native -o seed004 seed004.c && ./seed004 --flows 1048576
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define HASH_HEADS (1u << 24)
#define PORT_BASE 1024u
#define TIMEOUT_US (180ull * 1000000ull)
#define HOSTS_2 254u
#define HOSTS_3 254u
#define SOURCE_PORTS 15000u

struct pkt {
    uint32_t ip;
    uint32_t port;
    uint32_t chksum;
    uint32_t l4_chksum;
    uint32_t l4_opt;
};

struct nat_entry {
    uint32_t lan_ip;
    uint32_t lan_port;
    uint64_t usec;
    bool valid;
};

struct hash_item {
    uint32_t nat_index;
    uint32_t key;
    struct hash_item *next;
    bool valid;
    char slot; /* 0-2: place in its three-item block */
} __attribute__((packed));

struct port_item {
    uint32_t port;
    struct port_item *next;
};

static struct hash_item **heads;
static struct nat_entry *nat_table;
static struct port_item *free_ports;
static uint32_t wan_ip;

static inline uint64_t now_usec(void) {
    struct timeval t;
    gettimeofday(&t, NULL);
    return (uint64_t)t.tv_sec * 1000000ull + (uint64_t)t.tv_usec;
}

/* The Linux x86-64 ip_fast_csum of the seed's time, over `words` 32-bit words. */
static inline uint32_t ip_fast_csum(const void *p, unsigned words) {
    unsigned sum;
    __asm__("  movl (%1), %0\n"
            "  subl $4, %2\n"
            "  jbe 2f\n"
            "  addl 4(%1), %0\n"
            "  adcl 8(%1), %0\n"
            "  adcl 12(%1), %0\n"
            "1: adcl 16(%1), %0\n"
            "  lea 4(%1), %1\n"
            "  decl %2\n"
            "  jne 1b\n"
            "  adcl $0, %0\n"
            "  movl %0, %2\n"
            "  shrl $16, %0\n"
            "  addw %w2, %w0\n"
            "  adcl $0, %0\n"
            "  notl %0\n"
            "2:"
            : "=r"(sum), "=r"(p), "=r"(words)
            : "1"(p), "2"(words)
            : "memory");
    return sum;
}

static inline uint32_t key_of(uint32_t ip, uint32_t port) { return (ip & 0xffff) << 16 | port; }

static int pop_port(void) {
    struct port_item *it = free_ports;
    if (!it) return -1;
    int port = (int)it->port;
    free_ports = it->next;
    free(it);
    return port;
}

static void push_port(uint32_t port) {
    struct port_item *it = malloc(sizeof *it);
    if (!it) { perror("malloc"); exit(2); }
    it->port = port;
    it->next = free_ports;
    free_ports = it;
}

static int find(uint32_t ip, uint32_t port) {
    uint32_t key = key_of(ip, port);
    for (struct hash_item *it = heads[key % HASH_HEADS]; it; it = it->next)
        if (it->key == key && it->valid) return (int)it->nat_index;
    return -1;
}

static struct hash_item *new_block(void) {
    struct hash_item *b = malloc(3 * sizeof *b);
    if (!b) { perror("malloc"); exit(2); }
    b->slot = 0;
    return b;
}

static void insert(uint32_t ip, uint32_t port, uint32_t index) {
    uint32_t key = key_of(ip, port);
    struct hash_item **head = &heads[key % HASH_HEADS], *item;
    if (!*head) {
        item = *head = new_block();
    } else {
        struct hash_item *last = *head;
        while (last->next) last = last->next;
        if (last->slot == 2) {
            item = new_block();
        } else {
            item = last + 1;
            item->slot = (char)(last->slot + 1);
        }
        last->next = item;
    }
    item->key = key;
    item->valid = true;
    item->nat_index = index;
    item->next = NULL;
}

static int lan_to_wan(struct pkt *p) {
    int index = find(p->ip, p->port);
    if (index >= 0 && now_usec() - nat_table[index].usec > TIMEOUT_US) {
        nat_table[index].valid = false;
        return -1;
    }
    if (index < 0) {
        int port = pop_port();
        if (port < 0) return -1;
        index = port - (int)PORT_BASE;
        struct nat_entry *e = &nat_table[index];
        e->lan_ip = p->ip;
        e->lan_port = p->port;
        e->valid = true;
        e->usec = now_usec();
        insert(p->ip, p->port, (uint32_t)index);
    }
    p->ip = wan_ip;
    p->port = (uint32_t)index + PORT_BASE;
    p->chksum = ip_fast_csum(p, sizeof *p / 4);
    nat_table[index].usec = now_usec();
    return 0;
}

static void wan_to_lan(struct pkt *p) {
    struct nat_entry *e = &nat_table[p->port - PORT_BASE];
    p->ip = e->lan_ip;
    p->port = e->lan_port;
    p->chksum = ip_fast_csum(p, sizeof *p / 4);
    e->usec = now_usec();
}

/* N unique inside endpoints drawn uniformly from the 254 x 254 hosts and
 * 15,000 source ports (splitmix64, repeats redrawn): the seed's "uniformly
 * distributed network activity", without its few duplicate flows. */
static void generate(struct pkt *pkts, uint64_t n) {
    const uint64_t space = (uint64_t)HOSTS_2 * HOSTS_3 * SOURCE_PORTS;
    uint8_t *taken = calloc(space / 8 + 1, 1);
    if (!taken) { perror("calloc"); exit(2); }
    uint64_t state = 0x5eed004;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t t;
        do {
            uint64_t z = (state += 0x9e3779b97f4a7c15ull);
            z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ z >> 27) * 0x94d049bb133111ebull;
            t = (z ^ z >> 31) % space;
        } while (taken[t / 8] >> (t % 8) & 1);
        taken[t / 8] |= (uint8_t)(1u << (t % 8));
        uint32_t host = (uint32_t)(t / SOURCE_PORTS);
        pkts[i].ip = 192u << 24 | 168u << 16 | (1 + host / HOSTS_3) << 8 | (1 + host % HOSTS_3);
        pkts[i].port = PORT_BASE + (uint32_t)(t % SOURCE_PORTS);
    }
    free(taken);
}

static double seconds_since(const struct timespec *a) {
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

/* Every packet out, then every reply back (the seed's order); returns ns per packet. */
static double run_pass(struct pkt *pkts, uint64_t n, uint64_t *errors) {
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (uint64_t i = 0; i < n; i++)
        if (lan_to_wan(&pkts[i]) < 0) (*errors)++;
    for (uint64_t i = 0; i < n; i++) wan_to_lan(&pkts[i]);
    return seconds_since(&start) * 1e9 / (double)(2 * n);
}

static uint64_t check(const struct pkt *pkts, const struct pkt *sent, uint64_t n) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++) bad += pkts[i].ip != sent[i].ip || pkts[i].port != sent[i].port;
    return bad;
}

int main(int argc, char **argv) {
    uint64_t n = 1u << 20;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--flows") && a + 1 < argc) {
            n = strtoull(argv[++a], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--flows N]\n", argv[0]);
            return 2;
        }
    }
    if (n == 0 || n > (uint64_t)HOSTS_2 * HOSTS_3 * SOURCE_PORTS || n > 0xffffffffull - PORT_BASE) {
        fprintf(stderr, "seed004: --flows must be between 1 and %u\n", HOSTS_2 * HOSTS_3 * SOURCE_PORTS);
        return 2;
    }
    heads = calloc(HASH_HEADS, sizeof *heads);
    nat_table = calloc(n, sizeof *nat_table);
    struct pkt *pkts = calloc(n, sizeof *pkts), *sent = calloc(n, sizeof *sent);
    if (!heads || !nat_table || !pkts || !sent) { perror("calloc"); return 2; }
    wan_ip = 10u << 24 | 10u << 16 | 10u << 8 | 10u;
    for (uint64_t i = n; i-- > 0;) push_port(PORT_BASE + (uint32_t)i);
    generate(pkts, n);
    memcpy(sent, pkts, n * sizeof *pkts);

    uint64_t errors = 0;
    double ns[2];
    ns[0] = run_pass(pkts, n, &errors);
    errors += check(pkts, sent, n);
    ns[1] = run_pass(pkts, n, &errors);
    errors += check(pkts, sent, n);
    const char *pass[2] = {"new", "established"};
    for (int k = 0; k < 2; k++)
        printf("{\"design\":\"seed004\",\"flows\":%llu,\"workers\":1,\"pass\":\"%s\",\"ns_per_packet\":%.3f,\"mpps\":%.3f,\"errors\":%llu}\n",
               (unsigned long long)n, pass[k], ns[k], 1e3 / ns[k], (unsigned long long)errors);
    return errors ? 1 : 0;
}
