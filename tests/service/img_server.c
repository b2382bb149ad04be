/* The image URL tests' web server (img_server.h). */
#include "img_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define POLL_MS 50          /* how soon the thread sees stop */
#define READ_TIMEOUT_S 2    /* a request's headers must arrive within this */
#define REQUEST_MAX 4096
#define BIG_LENGTH (1L << 30)
#define ENDLESS_MAX (256L << 20) /* /endless stops here even if the client reads on */

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        c += k;
        n -= (size_t)k;
    }
}

static void head(int fd, const char *status, const char *extra)
{
    char h[512];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %s\r\nConnection: close\r\n%s\r\n", status, extra);
    send_all(fd, h, (size_t)n);
}

/* Answer one connection; false when it is held open (/slow). */
static bool serve(img_server *s, int fd)
{
    struct timeval tv = {READ_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[REQUEST_MAX + 1];
    size_t len = 0;
    while (len < REQUEST_MAX) {
        ssize_t k = recv(fd, req + len, REQUEST_MAX - len, 0);
        if (k <= 0)
            return true;
        len += (size_t)k;
        req[len] = 0;
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    char path[256] = "";
    sscanf(req, "GET %255s", path);
    char extra[256];
    s->served++;
    if (!strcmp(path, "/img")) {
        snprintf(extra, sizeof extra, "Content-Type: image/jpeg\r\nContent-Length: %zu\r\n",
                 s->image_len);
        head(fd, "200 OK", extra);
        send_all(fd, s->image, s->image_len);
    } else if (!strcmp(path, "/text")) {
        static const char page[] = "<html><body>not an image</body></html>";
        snprintf(extra, sizeof extra, "Content-Type: text/html\r\nContent-Length: %zu\r\n",
                 sizeof page - 1);
        head(fd, "200 OK", extra);
        send_all(fd, page, sizeof page - 1);
    } else if (!strcmp(path, "/redirect")) {
        head(fd, "302 Found", "Location: /img\r\nContent-Length: 0\r\n");
    } else if (!strcmp(path, "/loop")) {
        head(fd, "302 Found", "Location: /loop\r\nContent-Length: 0\r\n");
    } else if (!strcmp(path, "/to-localhost")) {
        snprintf(extra, sizeof extra, "Location: http://localhost:%d/img\r\nContent-Length: 0\r\n",
                 s->port);
        head(fd, "302 Found", extra);
    } else if (!strcmp(path, "/big")) {
        snprintf(extra, sizeof extra, "Content-Type: image/jpeg\r\nContent-Length: %ld\r\n",
                 BIG_LENGTH);
        head(fd, "200 OK", extra);
    } else if (!strcmp(path, "/endless")) {
        head(fd, "200 OK", "Content-Type: image/jpeg\r\n");
        static const char block[64 * 1024];
        for (long sent = 0; sent < ENDLESS_MAX && !s->stop; sent += (long)sizeof block)
            if (send(fd, block, sizeof block, MSG_NOSIGNAL) <= 0)
                break;
    } else if (!strcmp(path, "/slow") && s->n_held < IMG_SERVER_HELD_MAX) {
        s->held[s->n_held++] = fd;
        return false;
    } else {
        head(fd, "404 Not Found", "Content-Length: 0\r\n");
    }
    return true;
}

static void *run(void *arg)
{
    img_server *s = arg;
    while (!s->stop) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, POLL_MS) <= 0)
            continue;
        int fd = accept(s->fd, NULL, NULL);
        if (fd >= 0 && serve(s, fd))
            close(fd);
    }
    return NULL;
}

bool img_server_start(img_server *s, const void *image, size_t len)
{
    memset(s, 0, sizeof *s);
    s->image = image;
    s->image_len = len;
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 64) ||
        getsockname(s->fd, (struct sockaddr *)&a, &alen))
        return false;
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, run, s) == 0;
}

void img_server_stop(img_server *s)
{
    s->stop = 1;
    pthread_join(s->thread, NULL);
    for (int i = 0; i < s->n_held; i++)
        close(s->held[i]);
    close(s->fd);
}
