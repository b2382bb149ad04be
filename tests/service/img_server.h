/* A small HTTP/1.1 server on 127.0.0.1 for the gateway's image URL tests,
 * on a thread of its own: each path is one behaviour a web server can show
 * a fetcher. Every answer closes its connection.
 *   /img          200, the image given at start
 *   /text         200, an HTML page (not an image)
 *   /missing      404
 *   /redirect     302 to /img
 *   /loop         302 to /loop
 *   /to-localhost 302 to http://localhost:<port>/img (another host name)
 *   /big          200 with a Content-Length of 1 GiB (and no such body)
 *   /endless      200 without a length, bytes until the client leaves
 *   /slow         no answer at all: the connection is held until stop
 * @locality: the test's main thread (start, stop); the server's own thread. */
#ifndef ML_TEST_IMG_SERVER_H
#define ML_TEST_IMG_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define IMG_SERVER_HELD_MAX 16

typedef struct img_server {
    int port;
    int fd;                         /* listening */
    const void *image;              /* borrowed */
    size_t image_len;
    pthread_t thread;
    volatile int stop;
    int held[IMG_SERVER_HELD_MAX];  /* /slow's connections */
    int n_held;
    volatile int served;            /* requests answered or held, for the tests' counts */
} img_server;

/* Listen on an ephemeral port of 127.0.0.1 and serve from a thread. */
bool img_server_start(img_server *s, const void *image, size_t len);
void img_server_stop(img_server *s);

#endif
