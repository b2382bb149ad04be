/* engine/list.h: pushes at both ends, removal at the head, the tail and in
 * the middle, removal while walking, an object in two lists at once, and a
 * zeroed list being empty. */
#include <string.h>

#include "harness.h"
#include "list.h"

typedef struct item {
    int value;
    ml_list_node a; /* not the first member: ml_list_entry must subtract */
    ml_list_node b;
} item;

/* The values of l (linked through a) from head to tail, checked against
 * the walk from tail to head and the count. */
static int values(const ml_list *l, int *out, int max)
{
    int n = 0, back = 0;
    for (ml_list_node *x = l->head; x && n < max; x = x->next)
        out[n++] = ml_list_entry(x, item, a)->value;
    for (ml_list_node *x = l->tail; x; x = x->prev) {
        back++;
        check(n - back >= 0 && ml_list_entry(x, item, a)->value == out[n - back],
              "backward walk differs at %d", back);
    }
    check(back == n && n == l->n, "forward %d, backward %d, n %d", n, back, l->n);
    return n;
}

static void check_values(const ml_list *l, const int *want, int n_want, const char *what)
{
    int got[16];
    int n = values(l, got, 16);
    check(n == n_want && !memcmp(got, want, (size_t)n * sizeof *got), "%s: %d values", what, n);
}

static void test_zeroed_is_empty(void)
{
    ml_list l;
    memset(&l, 0, sizeof l);
    check(!l.head && !l.tail && l.n == 0, "zeroed list not empty");
    check(ml_list_entry(l.head, item, a) == NULL, "entry of NULL is not NULL");
}

static void test_push_remove(void)
{
    item it[5];
    ml_list l = {0};
    for (int i = 0; i < 5; i++)
        it[i].value = i;
    ml_list_push_back(&l, &it[1].a);
    ml_list_push_back(&l, &it[2].a);
    ml_list_push_front(&l, &it[0].a);
    ml_list_push_back(&l, &it[3].a);
    ml_list_push_back(&l, &it[4].a);
    check_values(&l, (int[]){0, 1, 2, 3, 4}, 5, "pushed");
    check(ml_list_entry(l.head, item, a) == &it[0] && ml_list_entry(l.tail, item, a) == &it[4],
          "ends");

    ml_list_remove(&l, &it[2].a);
    check(!it[2].a.prev && !it[2].a.next, "removed node keeps links");
    check_values(&l, (int[]){0, 1, 3, 4}, 4, "middle removed");
    ml_list_remove(&l, &it[0].a);
    check_values(&l, (int[]){1, 3, 4}, 3, "head removed");
    ml_list_remove(&l, &it[4].a);
    check_values(&l, (int[]){1, 3}, 2, "tail removed");
    /* Move to front, as an LRU does. */
    ml_list_remove(&l, &it[3].a);
    ml_list_push_front(&l, &it[3].a);
    check_values(&l, (int[]){3, 1}, 2, "moved to front");
    ml_list_remove(&l, &it[3].a);
    ml_list_remove(&l, &it[1].a);
    check(!l.head && !l.tail && l.n == 0, "emptied list not empty");
    ml_list_push_front(&l, &it[2].a);
    check_values(&l, (int[]){2}, 1, "one pushed on an emptied list");
}

static void test_remove_while_walking(void)
{
    item it[6];
    ml_list l = {0};
    for (int i = 0; i < 6; i++) {
        it[i].value = i;
        ml_list_push_back(&l, &it[i].a);
    }
    for (ml_list_node *x = l.head, *next; x; x = next) {
        next = x->next;
        if (ml_list_entry(x, item, a)->value % 2 == 0)
            ml_list_remove(&l, x);
    }
    check_values(&l, (int[]){1, 3, 5}, 3, "evens removed while walking");
}

static void test_two_lists(void)
{
    item it[3];
    ml_list la = {0}, lb = {0};
    for (int i = 0; i < 3; i++) {
        it[i].value = i;
        ml_list_push_back(&la, &it[i].a);
        ml_list_push_front(&lb, &it[i].b);
    }
    ml_list_remove(&lb, &it[1].b);
    check_values(&la, (int[]){0, 1, 2}, 3, "list a untouched by list b");
    int n = 0, got[3];
    for (ml_list_node *x = lb.head; x; x = x->next)
        got[n++] = ml_list_entry(x, item, b)->value;
    check(n == 2 && lb.n == 2 && got[0] == 2 && got[1] == 0, "list b: %d values", n);
}

int main(void)
{
    test_zeroed_is_empty();
    test_push_remove();
    test_remove_while_walking();
    test_two_lists();
    return check_done();
}
