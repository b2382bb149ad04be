/* An intrusive doubly linked list: the object embeds an ml_list_node and
 * ml_list_entry gets the object back from it (the Linux kernel's
 * list_head and container_of), so linking allocates nothing and one object
 * can sit in several lists through several nodes.
 *
 * Unlike the kernel's, the list is not circular: the ends are NULL and the
 * head keeps its tail and length, so a zeroed ml_list is empty (a calloc'd
 * owner needs no init and can be destroyed half-built) and a walk stops at
 * NULL:
 *
 *     for (ml_list_node *n = l->head; n; n = n->next)
 *         use(ml_list_entry(n, struct obj, link));
 *
 * Removing the node being visited is allowed when its successor was read
 * first. Every call is O(1); none checks that a node is in the list it is
 * given, which is the caller's invariant.
 *
 * @locality: no locking; the owner of the list serialises its calls. */
#ifndef ML_LIST_H
#define ML_LIST_H

#include <assert.h>
#include <stddef.h>

typedef struct ml_list_node {
    struct ml_list_node *prev, *next; /* NULL at the ends and when unlinked */
} ml_list_node;

typedef struct ml_list {
    ml_list_node *head, *tail;        /* NULL when empty */
    int n;
} ml_list;

/* The object of type `type` whose member `member` is node n; NULL for n
 * NULL, so ml_list_entry(l->head, ...) is NULL on an empty list. */
#define ml_list_entry(n, type, member) \
    ((type *)ml_list_container((n), offsetof(type, member)))

static inline void *ml_list_container(const ml_list_node *n, size_t offset)
{
    return n ? (void *)((char *)n - offset) : NULL;
}

static inline void ml_list_push_back(ml_list *l, ml_list_node *x)
{
    x->prev = l->tail;
    x->next = NULL;
    if (l->tail)
        l->tail->next = x;
    else
        l->head = x;
    l->tail = x;
    l->n++;
}

static inline void ml_list_push_front(ml_list *l, ml_list_node *x)
{
    x->prev = NULL;
    x->next = l->head;
    if (l->head)
        l->head->prev = x;
    else
        l->tail = x;
    l->head = x;
    l->n++;
}

/* Unlink x, which must be in l; x's links are cleared. */
static inline void ml_list_remove(ml_list *l, ml_list_node *x)
{
    assert(l->n > 0);
    if (x->prev)
        x->prev->next = x->next;
    else
        l->head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        l->tail = x->prev;
    x->prev = x->next = NULL;
    l->n--;
}

#endif
