/* The `mllama` CLI subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status.
 * @locality: the main thread. */
#ifndef SVC_COMMANDS_H
#define SVC_COMMANDS_H

/* Exit statuses shared by the subcommands. */
enum {
    SVC_EXIT_OK = 0,
    SVC_EXIT_FAILURE = 1, /* the command ran and failed (bad file, bad input) */
    SVC_EXIT_USAGE = 2,   /* bad command line */
};

int cmd_preprocess(int argc, char **argv);
int cmd_mock_kafka(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_gateway(int argc, char **argv);
int cmd_submit(int argc, char **argv);
int cmd_healthcheck(int argc, char **argv);

#endif
