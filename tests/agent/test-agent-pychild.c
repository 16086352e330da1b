/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The portable agent's python3 child, driven on the host with the host's
 * /usr/bin/python3: first the child protocol itself (agent-pychild.c), then
 * eval and run_code through an in-process Agent of the portable build
 * (agent-python-child.c): globals persist, a timeout keeps them, a killed
 * child is reported and then started again, and without python3 the
 * refusal says so. No VM, no channel.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-pychild.h"
#include "agent-python.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

#define HOST_PYTHON "/usr/bin/python3"

static char *env_host[] = { (char *) "PATH=/usr/bin:/bin", (char *) "LANG=C.UTF-8", NULL };

static const char *str(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !v)
                return NULL;
        return json_object_get_string(v);
}

static int64_t num(struct json_object *o, const char *key) {
        struct json_object *v;

        assert_true(json_object_object_get_ex(o, key, &v));
        return json_object_get_int64(v);
}

static bool flag(struct json_object *o, const char *key) {
        struct json_object *v;

        return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

static struct json_object *call(PyChild *c, const char *op, const char *code, unsigned timeout) {
        struct json_object *o = NULL;
        int status;

        assert_int_equal(pychild_call(c, op, code, timeout, &o, &status), 0);
        return o;
}

/* ---- the protocol ---- */

static void test_child_protocol(void **state) {
        PyChild c = PYCHILD_NULL;
        struct json_object *o;
        int status;

        if (access(HOST_PYTHON, X_OK) < 0)
                skip();
        assert_int_equal(pychild_start(&c, HOST_PYTHON, env_host, "/", NULL), 0);
        assert_non_null(c.version);
        assert_true(strncmp(c.version, "3.", 2) == 0);

        o = call(&c, "eval", "1 + 1", 5);
        assert_string_equal(str(o, "result"), "2");
        assert_null(str(o, "error"));
        assert_int_equal(num(o, "exit_code"), 0);
        json_object_put(o);

        /* globals persist between calls, output is captured */
        o = call(&c, "run_code", "x = 41\nprint('hello')\nimport sys; print('err', file=sys.stderr)", 5);
        assert_string_equal(str(o, "stdout"), "hello\n");
        assert_string_equal(str(o, "stderr"), "err\n");
        assert_int_equal(num(o, "exit_code"), 0);
        json_object_put(o);
        o = call(&c, "eval", "x + 1", 5);
        assert_string_equal(str(o, "result"), "42");
        json_object_put(o);

        /* a fresh namespace sees nothing of them */
        o = call(&c, "eval_fresh", "x", 5);
        assert_string_equal(str(o, "error"), "NameError: name 'x' is not defined");
        assert_int_equal(num(o, "exit_code"), 1);
        json_object_put(o);

        /* an exception: error, traceback in stderr */
        o = call(&c, "run_code", "1/0", 5);
        assert_string_equal(str(o, "error"), "ZeroDivisionError: division by zero");
        assert_non_null(strstr(str(o, "stderr"), "Traceback"));
        json_object_put(o);

        /* SystemExit: its code, the child stays */
        o = call(&c, "run_code", "raise SystemExit(3)", 5);
        assert_int_equal(num(o, "exit_code"), 3);
        assert_string_equal(str(o, "error"), "SystemExit: 3");
        json_object_put(o);

        /* a timeout interrupts the code and keeps the globals */
        o = call(&c, "run_code", "y = 1\nwhile True:\n    pass\n", 1);
        assert_true(flag(o, "timed_out"));
        assert_int_equal(num(o, "exit_code"), 124);
        assert_string_equal(str(o, "error"), "TimeoutError: code ran longer than 1 s");
        json_object_put(o);
        o = call(&c, "eval", "(x, y)", 5);
        assert_string_equal(str(o, "result"), "(41, 1)");
        json_object_put(o);

        /* "except Exception" does not swallow the timeout */
        o = call(&c, "run_code", "while True:\n    try:\n        pass\n    except Exception:\n        pass\n", 1);
        assert_true(flag(o, "timed_out"));
        json_object_put(o);

        /* a fork in user code never answers */
        o = call(&c, "eval", "__import__('os').fork() and 7", 5);
        assert_string_equal(str(o, "result"), "7");
        json_object_put(o);

        o = call(&c, "reseed", NULL, 5);
        assert_true(flag(o, "ok"));
        json_object_put(o);

        /* killed: the next call says so, with how it ended */
        assert_int_equal(kill(c.pid, SIGKILL), 0);
        assert_int_equal(pychild_call(&c, "eval", "1", 5, &o, &status), -EPIPE);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        assert_int_equal(c.pid, 0);
        assert_int_equal(pychild_call(&c, "eval", "1", 5, &o, &status), -EPIPE);
        pychild_stop(&c, false);
}

static void test_child_not_python(void **state) {
        char dir[] = "/tmp/test-agent-pychild-XXXXXX", p[256], q[256];
        PyChild c = PYCHILD_NULL;
        FILE *f;

        assert_non_null(mkdtemp(dir));
        /* a python3 that says nothing (cannot run our bootstrap) */
        snprintf(p, sizeof p, "%s/python3", dir);
        f = fopen(p, "w");
        assert_non_null(f);
        fputs("#!/bin/sh\nexit 0\n", f);
        fclose(f);
        assert_int_equal(chmod(p, 0755), 0);
        assert_int_equal(pychild_start(&c, p, env_host, NULL, NULL), -EPROTONOSUPPORT);

        /* one that says it is too old */
        snprintf(q, sizeof q, "%s/python-old", dir);
        f = fopen(q, "w");
        assert_non_null(f);
        fputs("#!/bin/sh\nexec " HOST_PYTHON " -c 'import os, struct, json\n"
              "b = json.dumps({\"hello\": 1, \"ok\": False, \"version\": \"3.7.9\"}).encode()\n"
              "os.write(4, struct.pack(\">I\", len(b)) + b)'\n", f);
        fclose(f);
        assert_int_equal(chmod(q, 0755), 0);
        if (access(HOST_PYTHON, X_OK) == 0)
                assert_int_equal(pychild_start(&c, q, env_host, NULL, NULL), -EPROTONOSUPPORT);

        /* none at all */
        assert_int_equal(pychild_start(&c, "/nonexistent/python3", env_host, NULL, NULL), -ENOENT);
        assert_int_equal(pychild_find("/nonexistent:/also-not", &(char *) { NULL }), -ENOENT);
        unlink(p);
        unlink(q);
        rmdir(dir);
}

/* ---- through the agent ---- */

typedef struct Reply {
        uint16_t type;
        struct json_object *obj;
} Reply;

static Reply request(Agent *a, const char *json) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        uint8_t hdr[FKA_HDR_SIZE];
        const void *p;
        size_t n;
        fka_frame f = {};
        Reply r = {};
        const char *err = NULL;

        fka_encode_header(hdr, FKA_REQUEST, 1, (uint32_t) strlen(json));
        agent_feed(a, hdr, sizeof hdr);
        agent_feed(a, json, strlen(json));

        p = a->out.buf + a->out.start;
        n = a->out.end - a->out.start;
        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), 1);
        assert_int_equal(n, 0);
        r.type = f.type;
        assert_int_equal(json_parse_strict(f.payload, f.len, FKA_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &r.obj, &err), 0);
        fka_frame_done(&f);
        a->out.start = a->out.end = 0;
        return r;
}

static Agent *new_agent(void) {
        AgentConfig c = { .channel = NULL, .python = true };
        Agent *a = NULL;

        assert_int_equal(agent_new(&c, &a), 0);
        return a;
}

static void test_agent_no_python(void **state) {
        AgentDefaults d = { .env = (char *[]) { (char *) "PATH=/nonexistent", NULL } };
        Agent *a = new_agent();
        Reply r;

        agent_python_set_defaults(&d);
        assert_int_equal(agent_python_init(), -ENOENT);
        assert_false(agent_python_ready());
        r = request(a, "{\"op\": \"run_code\", \"code\": \"1\"}");
        assert_int_equal(r.type, FKA_ERROR);
        assert_string_equal(str(r.obj, "error"),
                            "this image has no python3 (3.8 or later): run_code needs one; exec works");
        json_object_put(r.obj);
        r = request(a, "{\"op\": \"ping\"}");
        assert_false(flag(r.obj, "python"));
        assert_null(str(r.obj, "python_path"));
        json_object_put(r.obj);
        agent_python_set_defaults(NULL);
        agent_free(a);
}

static void test_agent_python(void **state) {
        AgentDefaults d = { .env = env_host };
        Agent *a;
        Reply r;
        int status;

        if (access(HOST_PYTHON, X_OK) < 0)
                skip();
        a = new_agent();
        agent_python_set_defaults(&d);
        assert_int_equal(agent_python_init(), 0);
        assert_true(agent_python_ready());

        r = request(a, "{\"op\": \"ping\"}");
        assert_string_equal(str(r.obj, "python_path"), HOST_PYTHON);
        assert_true(strncmp(str(r.obj, "python_version"), "3.", 2) == 0);
        assert_true(flag(r.obj, "python"));
        json_object_put(r.obj);

        r = request(a, "{\"op\": \"run_code\", \"code\": \"z = 5\\nprint(z)\"}");
        assert_int_equal(r.type, FKA_RESPONSE);
        assert_string_equal(str(r.obj, "stdout"), "5\n");
        assert_false(json_object_object_get_ex(r.obj, "result", NULL)); /* run_code has none */
        assert_true(json_object_object_get_ex(r.obj, "error", NULL));
        assert_false(flag(r.obj, "truncated"));
        json_object_put(r.obj);

        r = request(a, "{\"op\": \"eval\", \"code\": \"z * 2\", \"timeout_secs\": 3}");
        assert_string_equal(str(r.obj, "result"), "10");
        json_object_put(r.obj);

        r = request(a, "{\"op\": \"run_code\", \"code\": \"while 1: pass\", \"timeout_secs\": 1}");
        assert_int_equal(r.type, FKA_RESPONSE);
        assert_true(flag(r.obj, "timed_out"));
        assert_int_equal(num(r.obj, "exit_code"), 124);
        json_object_put(r.obj);
        r = request(a, "{\"op\": \"eval\", \"code\": \"z\"}");
        assert_string_equal(str(r.obj, "result"), "5");
        json_object_put(r.obj);

        /* kill the child and reap it as the loop would: the next call says so ... */
        r = request(a, "{\"op\": \"eval\", \"code\": \"__import__('os').getpid()\"}");
        pid_t pid = (pid_t) atoi(str(r.obj, "result"));
        json_object_put(r.obj);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        agent_python_reaped(pid, status);
        r = request(a, "{\"op\": \"eval\", \"code\": \"z\"}");
        assert_int_equal(r.type, FKA_ERROR);
        assert_non_null(strstr(str(r.obj, "error"), "python3 is gone (killed by signal 9)"));
        json_object_put(r.obj);

        /* ... and the one after starts a new child, without the globals */
        r = request(a, "{\"op\": \"eval\", \"code\": \"z\"}");
        assert_int_equal(r.type, FKA_RESPONSE);
        assert_true(flag(r.obj, "python_restarted"));
        assert_string_equal(str(r.obj, "error"), "NameError: name 'z' is not defined");
        json_object_put(r.obj);
        r = request(a, "{\"op\": \"eval\", \"code\": \"1\"}");
        assert_false(json_object_object_get_ex(r.obj, "python_restarted", NULL));
        json_object_put(r.obj);

        /* the child dies during a call */
        r = request(a, "{\"op\": \"run_code\", \"code\": \"import os; os._exit(5)\"}");
        assert_int_equal(r.type, FKA_ERROR);
        assert_non_null(strstr(str(r.obj, "error"), "exited with status 5"));
        json_object_put(r.obj);
        r = request(a, "{\"op\": \"eval\", \"code\": \"2\"}");
        assert_string_equal(str(r.obj, "result"), "2");
        json_object_put(r.obj);

        agent_free(a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_child_protocol),
                cmocka_unit_test(test_child_not_python),
                cmocka_unit_test(test_agent_no_python),
                cmocka_unit_test(test_agent_python),
        };

        (void) signal(SIGPIPE, SIG_IGN);
        log_max_level = LOG_LVL_ERR;
        return cmocka_run_group_tests(tests, NULL, NULL);
}
