/* `mllama healthcheck`: GET a worker endpoint and exit 0 on HTTP 200, so a
 * container HEALTHCHECK needs no curl in the image. @locality: main thread. */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/commands.h"

#define TIMEOUT_MS 3000

int cmd_healthcheck(int argc, char **argv)
{
    const char *url = argc == 3 && !strcmp(argv[1], "--url") ? argv[2] : NULL;
    char host[256], port[16] = "80", path[512] = "/";
    if (!url || sscanf(url, "http://%255[^:/]:%15[0-9]%511s", host, port, path) < 2) {
        fprintf(stderr, "usage: mllama healthcheck --url http://HOST:PORT/PATH\n");
        return SVC_EXIT_USAGE;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        fprintf(stderr, "healthcheck: cannot resolve %s\n", host);
        return SVC_EXIT_FAILURE;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    freeaddrinfo(ai);
    char req[700], resp[256] = "";
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
    if (ok)
        ok = send(fd, req, (size_t)n, MSG_NOSIGNAL) == n;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t got = ok && poll(&pfd, 1, TIMEOUT_MS) == 1 ? recv(fd, resp, sizeof resp - 1, 0) : -1;
    if (fd >= 0)
        close(fd);
    if (got > 0)
        resp[got] = 0;
    int status = got > 0 && !strncmp(resp, "HTTP/1.", 7) ? atoi(resp + 9) : 0;
    if (status != 200) {
        fprintf(stderr, "healthcheck: %s: %s\n", url, status ? resp : "no answer");
        return SVC_EXIT_FAILURE;
    }
    return SVC_EXIT_OK;
}
