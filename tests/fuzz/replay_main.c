/* Replays fuzz seeds without libFuzzer: every regular file under the
 * directories (or the files) named on the command line is fed once to
 * LLVMFuzzerTestOneInput. Linked into fuzz targets when MLLAMA_FUZZ is off, so
 * the ordinary and sanitizer builds exercise each target on its corpus. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return 1;
    }
    size_t n = (size_t)st.st_size;
    /* malloc(n) exactly, so ASan catches a read one past the input. */
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "replay: %s: short read\n", path);
        free(buf);
        fclose(f);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int n_inputs = 0, failures = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            failures += replay_file(argv[i]);
            n_inputs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d)
            return 1;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            failures += replay_file(path);
            n_inputs++;
        }
        closedir(d);
    }
    fprintf(stderr, "replayed %d inputs\n", n_inputs);
    if (n_inputs == 0) {
        fprintf(stderr, "replay: no seed inputs found\n");
        return 1;
    }
    return failures ? 1 : 0;
}
