/* The per-partition offset tracker: which consumed offsets may be committed.
 *
 * At-least-once with continuous batching (service/README.md §2): a request's offset
 * may be stored only once its final reply record is acknowledged by the
 * broker, and committing offset N+1 declares every offset <= N done. Requests
 * of one partition start in offset order but finish in any order, so per
 * partition this keeps the begun-but-unfinished offsets in arrival order and
 * reports the committable offset:
 *
 *     the first unfinished offset, or (none pending) the last begun + 1.
 *
 * Every consumed message is begun and later finished, whatever became of it:
 * a generated reply, an error reply for bad input, a dead-letter record, or
 * nothing at all (finish at once). A message whose final record is never
 * delivered is never finished, so the committed offset stops before it and a
 * restart or the partition's next owner runs it again.
 *
 * A partition's state lives from svc_offsets_assign to svc_offsets_revoke.
 * Each assignment gets a new epoch, carried in the ticket begin hands out, so
 * a late finish for an earlier assignment of the same partition (revoked,
 * then assigned back, the offset begun again) cannot finish the new attempt.
 *
 * Pure logic: no Kafka, no locks, no I/O.
 * @locality one thread at a time; the consumer uses it only on the Kafka
 *           thread (see kafka.h). */
#ifndef SVC_OFFSETS_H
#define SVC_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

typedef struct svc_offsets svc_offsets;

/* One begun message. A value: copy it into the request that the message
 * started and hand it back to svc_offsets_finish. */
typedef struct svc_offset_ticket {
    int32_t topic_id;  /* the caller's small integer for the topic */
    int32_t partition;
    int64_t offset;
    uint64_t epoch;    /* the partition assignment that began it; never 0 */
} svc_offset_ticket;

typedef enum svc_offsets_status {
    SVC_OFFSETS_OK = 0,
    SVC_OFFSETS_DUPLICATE,    /* begin: offset <= one already begun in this assignment */
    SVC_OFFSETS_NOT_ASSIGNED, /* partition not tracked, or the ticket is from an earlier assignment */
    SVC_OFFSETS_UNKNOWN,      /* finish: offset not pending (finished already, or never begun) */
    SVC_OFFSETS_INVALID,      /* begin: negative offset */
    SVC_OFFSETS_NOMEM,
} svc_offsets_status;

/* Stable lower-case name of a status. Never NULL. */
const char *svc_offsets_status_name(svc_offsets_status st);

/* Returns an empty tracker, or NULL when out of memory. */
svc_offsets *svc_offsets_create(void);

/* Frees everything. NULL is a no-op. */
void svc_offsets_destroy(svc_offsets *o);

/* Start tracking a partition under a new epoch, nothing begun. A partition
 * already tracked keeps its state (an eager rebalance may list it again).
 * Returns OK or NOMEM (nothing changed). */
svc_offsets_status svc_offsets_assign(svc_offsets *o, int32_t topic_id, int32_t partition);

/* Copy up to `cap` tickets of the partition's unfinished offsets, in offset
 * order, into out (may be NULL when cap is 0). Returns how many are pending
 * (0 when the partition is not tracked), which may exceed cap. */
size_t svc_offsets_pending(const svc_offsets *o, int32_t topic_id, int32_t partition,
                           svc_offset_ticket *out, size_t cap);

/* Forget a partition (revoked or lost). Tickets from its epoch now finish
 * as NOT_ASSIGNED. A partition not tracked is a no-op. */
void svc_offsets_revoke(svc_offsets *o, int32_t topic_id, int32_t partition);

/* Record that `offset` started. Offsets of a partition must begin in
 * increasing order (gaps are fine: compaction, control records); an offset
 * <= the last begun one is a redelivery of something pending or done and is
 * answered DUPLICATE (the caller drops the message). On OK *ticket is set;
 * on any error the tracker is unchanged and *ticket is untouched. */
svc_offsets_status svc_offsets_begin(svc_offsets *o, int32_t topic_id, int32_t partition,
                                     int64_t offset, svc_offset_ticket *ticket);

/* Record that the ticket's message is done. On OK, *commit is the new
 * committable offset when it advanced (the value to store: the next offset
 * to consume), else -1. Errors (tracker unchanged, *commit = -1):
 * NOT_ASSIGNED (revoked since, or another epoch), UNKNOWN (not pending). */
svc_offsets_status svc_offsets_finish(svc_offsets *o, const svc_offset_ticket *ticket,
                                      int64_t *commit);

/* The partition's committable offset now, or -1 when nothing was begun in
 * this assignment or the partition is not tracked. */
int64_t svc_offsets_committable(const svc_offsets *o, int32_t topic_id, int32_t partition);

#endif
