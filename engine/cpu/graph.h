/* Graph recording and replay of the CPU backend (graph.c): the layer over
 * the op table that backend.h's graph_begin, graph_end and graph_replay
 * name. It uses the core (cpu_internal.h) and nothing else of engine/cpu;
 * cpu_backend.c puts its entries in the table and owns its state.
 * @locality: the thread driving the backend, as every op. */
#ifndef ML_CPU_GRAPH_H
#define ML_CPU_GRAPH_H

#include "backend.h"

/* A backend's graph slots and the recording under way, if any. */
typedef struct ml_cpu_graphs ml_cpu_graphs;

/* Empty slots, nothing being recorded; NULL when out of memory. */
ml_cpu_graphs *ml_cpu_graphs_create(void);

/* Free every slot and a recording under way. NULL is a no-op. */
void ml_cpu_graphs_destroy(ml_cpu_graphs *gs);

/* The op table's graph entries (contracts in backend.h). */
void ml_cpu_graph_begin(ml_backend *be, int slot);
void ml_cpu_graph_end(ml_backend *be, int slot);
void ml_cpu_graph_replay(ml_backend *be, int slot);

#endif
