/* SPDX-License-Identifier: LGPL-2.1-or-later */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <sys/time.h>

#include "agent-python.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

/* Private helpers, run once in a namespace of their own (not in sys.modules,
 * not in the user's globals). */
static const char helper_source[] =
        "import io, os, sys, traceback\n"
        "class Capped(io.TextIOBase):\n"
        "    def __init__(self, cap):\n"
        "        super().__init__()\n"
        "        self._parts = []\n"
        "        self._n = 0\n"
        "        self._cap = cap\n"
        "        self.truncated = False\n"
        "    @property\n"
        "    def encoding(self):\n"
        "        return 'utf-8'\n"
        "    def writable(self):\n"
        "        return True\n"
        "    def isatty(self):\n"
        "        return False\n"
        "    def write(self, s):\n"
        "        if not isinstance(s, str):\n"
        "            raise TypeError('write() argument must be str, not ' + type(s).__name__)\n"
        "        n = len(s)\n"
        "        room = self._cap - self._n\n"
        "        if n > room:\n"
        "            s = s[:max(room, 0)]\n"
        "            self.truncated = True\n"
        "        if s:\n"
        "            self._parts.append(s)\n"
        "            self._n += len(s)\n"
        "        return n\n"
        "    def flush(self):\n"
        "        pass\n"
        "    def getvalue(self):\n"
        "        return ''.join(self._parts)\n"
        "def describe(e):\n"
        "    try:\n"
        "        only = traceback.format_exception_only(type(e), e)\n"
        "        line = only[-1].strip() if only else type(e).__name__\n"
        "    except BaseException:\n"
        "        line = type(e).__name__\n"
        "    try:\n"
        "        tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))\n"
        "    except BaseException:\n"
        "        tb = line + '\\n'\n"
        "    return line, tb\n"
        "def reseed():\n"
        "    m = sys.modules.get('random')\n"
        "    if m is not None:\n"
        "        m.seed(os.urandom(32))\n"
        "    m = sys.modules.get('numpy.random')\n"
        "    if m is not None:\n"
        "        m.seed(int.from_bytes(os.urandom(4), 'little'))\n"
        "    m = sys.modules.get('tempfile')\n"
        "    if m is not None:\n"
        "        m._name_sequence = None\n"
        "sys.stdin = io.StringIO('')\n";

static struct {
        bool ready;
        PyThreadState *ts;          /* saved while the loop runs without the GIL */
        PyObject *globals;          /* __main__.__dict__ */
        PyObject *numpy;            /* the module, or NULL */
        PyObject *capped;           /* class Capped */
        PyObject *describe;
        PyObject *reseed;
        PyObject *alarm_handler;
        char *numpy_version;
        volatile sig_atomic_t armed;
        bool fired;
} py;

void agent_python_set_defaults(const struct AgentDefaults *d) {
}

void agent_python_describe(struct json_object *o) {
}

void agent_python_reaped(pid_t pid, int status) {
}

bool agent_python_ready(void) {
        return py.ready;
}

const char *agent_python_numpy_version(void) {
        return py.numpy_version;
}

/* ---- the timeout: ITIMER_REAL, handled by a Python-level handler (so it
 * runs between bytecodes, in the main thread) that raises only while armed ---- */

static PyObject *alarm_cb(PyObject *self, PyObject *args) {
        if (!py.armed)
                Py_RETURN_NONE;
        py.fired = true;
        /* a BaseException, so that "except Exception" in user code does not swallow it */
        PyErr_SetString(PyExc_KeyboardInterrupt, "timeout");
        return NULL;
}

static PyMethodDef alarm_def = { "forkd_alarm", alarm_cb, METH_VARARGS, NULL };

static void timer_arm(unsigned secs) {
        struct itimerval it = {
                .it_value.tv_sec = secs,
                .it_interval.tv_usec = 100 * 1000, /* again and again, until the code gives up */
        };

        py.fired = false;
        py.armed = 1;
        (void) setitimer(ITIMER_REAL, &it, NULL);
}

static void timer_disarm(void) {
        struct itimerval it = {};

        (void) setitimer(ITIMER_REAL, &it, NULL);
        py.armed = 0;
}

/* ---- start-up ---- */

static int python_setup(void) {
        PyObject *ns, *r, *main_mod, *np, *signal_mod, *res;

        main_mod = PyImport_AddModule("__main__"); /* borrowed */
        if (!main_mod)
                return -EIO;
        py.globals = PyModule_GetDict(main_mod);
        Py_INCREF(py.globals);

        ns = PyDict_New();
        if (!ns)
                return -ENOMEM;
        if (PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) < 0) {
                Py_DECREF(ns);
                return -EIO;
        }
        r = PyRun_String(helper_source, Py_file_input, ns, ns);
        if (!r) {
                Py_DECREF(ns);
                return -EIO;
        }
        Py_DECREF(r);
        py.capped = PyDict_GetItemString(ns, "Capped");
        py.describe = PyDict_GetItemString(ns, "describe");
        py.reseed = PyDict_GetItemString(ns, "reseed");
        Py_XINCREF(py.capped);
        Py_XINCREF(py.describe);
        Py_XINCREF(py.reseed);
        Py_DECREF(ns);
        if (!py.capped || !py.describe || !py.reseed)
                return -EIO;

        /* the timeout's handler */
        py.alarm_handler = PyCFunction_New(&alarm_def, NULL);
        if (!py.alarm_handler)
                return -EIO;
        signal_mod = PyImport_ImportModule("signal");
        if (!signal_mod)
                return -EIO;
        res = PyObject_CallMethod(signal_mod, "signal", "iO", SIGALRM, py.alarm_handler);
        Py_DECREF(signal_mod);
        if (!res)
                return -EIO;
        Py_DECREF(res);

        /* numpy, when it is there */
        np = PyImport_ImportModule("numpy");
        if (np) {
                PyObject *v = PyObject_GetAttrString(np, "__version__");

                if (v && PyUnicode_Check(v)) {
                        const char *s = PyUnicode_AsUTF8(v);

                        if (s)
                                py.numpy_version = strdup(s);
                }
                Py_XDECREF(v);
                (void) PyDict_SetItemString(py.globals, "numpy", np);
                (void) PyDict_SetItemString(py.globals, "np", np);
                py.numpy = np; /* the reference is kept */
        } else
                log_info("numpy is not importable; continuing without it.");
        PyErr_Clear();
        return 0;
}

int agent_python_init(void) {
        PyPreConfig pre;
        PyConfig config;
        PyStatus st;
        int r;

        /* UTF-8 mode: a minimal guest may have no locale at all */
        PyPreConfig_InitIsolatedConfig(&pre);
        pre.utf8_mode = 1;
        st = Py_PreInitialize(&pre);
        if (PyStatus_Exception(st)) {
                log_error("Failed to pre-initialise Python: %s", st.err_msg ?: "?");
                return -EIO;
        }

        PyConfig_InitIsolatedConfig(&config); /* no PYTHON* variables, no user site, no cwd in sys.path */
        config.install_signal_handlers = 0;  /* SIGINT and friends stay PID 1's */
        config.configure_c_stdio = 0;
        config.parse_argv = 0;
        config.write_bytecode = 0;
        config.site_import = 1;               /* dist-packages, where Debian puts numpy */

        st = PyConfig_SetString(&config, &config.program_name, L"python3");
        /* With the interpreter's path as the executable, the prefix (and the
         * standard library) is found as python3 finds it; sys.executable is
         * then something a subprocess can run, not the agent. */
        if (!PyStatus_Exception(st) && access("/usr/bin/python3", X_OK) == 0)
                st = PyConfig_SetString(&config, &config.executable, L"/usr/bin/python3");
        if (!PyStatus_Exception(st))
                st = Py_InitializeFromConfig(&config);
        PyConfig_Clear(&config);
        if (PyStatus_Exception(st)) {
                log_error("Failed to start Python: %s", st.err_msg ?: "?");
                return -EIO;
        }

        r = python_setup();
        if (r < 0) {
                PyErr_Clear();
                log_error_errno(r, "Failed to set up Python: %m");
                py.ts = PyEval_SaveThread();
                return r;
        }

        py.ready = true;
        py.ts = PyEval_SaveThread(); /* the loop runs without the GIL */
        return 0;
}

void agent_python_reseed(void) {
        PyObject *r;

        if (!py.ready)
                return;
        PyEval_RestoreThread(py.ts);
        r = PyObject_CallNoArgs(py.reseed);
        if (!r)
                log_warning("Failed to reseed Python's generators.");
        Py_XDECREF(r);
        PyErr_Clear();
        py.ts = PyEval_SaveThread();
}

/* ---- eval / run_code ---- */

typedef struct PyOutcome {
        char *result;        /* eval: repr(value); NULL for none */
        char *error;         /* "Type: message"; NULL for none */
        char *out, *err;
        size_t result_len, out_len, err_len;
        int exit_code;
        bool truncated;
        bool timed_out;
} PyOutcome;

static void py_outcome_done(PyOutcome *o) {
        free(o->result);
        free(o->error);
        free(o->out);
        free(o->err);
}

/* str -> malloc()ed UTF-8 (lone surrogates as \uXXXX), at most max bytes */
static char *py_to_utf8(PyObject *s, size_t max, size_t *ret_len, bool *truncated) {
        PyObject *b;
        char *data, *copy;
        Py_ssize_t n;
        size_t len;

        if (!s || !PyUnicode_Check(s))
                return NULL;
        b = PyUnicode_AsEncodedString(s, "utf-8", "backslashreplace");
        if (!b) {
                PyErr_Clear();
                return NULL;
        }
        if (PyBytes_AsStringAndSize(b, &data, &n) < 0) {
                PyErr_Clear();
                Py_DECREF(b);
                return NULL;
        }
        len = (size_t) n;
        if (len > max) {
                len = utf8_prefix(data, max);
                *truncated = true;
        }
        copy = malloc(len + 1);
        if (copy) {
                memcpy(copy, data, len);
                copy[len] = 0;
                *ret_len = len;
        }
        Py_DECREF(b);
        return copy;
}

static void capture_write(PyObject *cap, const char *s) {
        PyObject *r = PyObject_CallMethod(cap, "write", "s", s);

        Py_XDECREF(r);
        PyErr_Clear();
}

static void capture_take(PyObject *cap, char **ret, size_t *ret_len, bool *truncated) {
        PyObject *v, *t;

        v = PyObject_CallMethod(cap, "getvalue", NULL);
        if (v) {
                *ret = py_to_utf8(v, 4 * AGENT_PY_OUTPUT_CAP, ret_len, truncated);
                Py_DECREF(v);
        }
        PyErr_Clear();
        t = PyObject_GetAttrString(cap, "truncated");
        if (t && PyObject_IsTrue(t) == 1)
                *truncated = true;
        Py_XDECREF(t);
        PyErr_Clear();
}

/* The exception is set: describe it into o and the captured stderr. */
static void py_handle_exception(PyOutcome *o, PyObject *err_cap, unsigned timeout_secs) {
        PyObject *exc = NULL, *t = NULL, *tb = NULL, *d;
        char buf[128];

        PyErr_Fetch(&t, &exc, &tb);
        PyErr_NormalizeException(&t, &exc, &tb);
        if (exc && tb)
                (void) PyException_SetTraceback(exc, tb);

        if (py.fired && t && PyErr_GivenExceptionMatches(t, PyExc_KeyboardInterrupt)) {
                (void) snprintf(buf, sizeof buf, "TimeoutError: code ran longer than %u s", timeout_secs);
                o->error = strdup(buf);
                o->exit_code = 124;
                o->timed_out = true;
                capture_write(err_cap, buf);
                capture_write(err_cap, "\n");
        } else if (t && PyErr_GivenExceptionMatches(t, PyExc_SystemExit)) {
                /* as the interpreter would exit: None 0, an int itself, else 1 with the value printed */
                PyObject *code = exc ? PyObject_GetAttrString(exc, "code") : NULL;

                PyErr_Clear();
                if (!code || code == Py_None)
                        o->exit_code = 0;
                else if (PyLong_Check(code)) {
                        long v = PyLong_AsLong(code);

                        o->exit_code = PyErr_Occurred() ? 1 : (int) MAX(MIN(v, (long) INT32_MAX), (long) INT32_MIN);
                        PyErr_Clear();
                } else {
                        PyObject *s = PyObject_Str(code);

                        if (s && PyUnicode_Check(s)) {
                                const char *u = PyUnicode_AsUTF8(s);

                                if (u) {
                                        capture_write(err_cap, u);
                                        capture_write(err_cap, "\n");
                                }
                        }
                        Py_XDECREF(s);
                        PyErr_Clear();
                        o->exit_code = 1;
                }
                Py_XDECREF(code);
                if (o->exit_code != 0) {
                        (void) snprintf(buf, sizeof buf, "SystemExit: %d", o->exit_code);
                        o->error = strdup(buf);
                }
        } else {
                bool dummy = false;
                size_t l;

                d = exc ? PyObject_CallFunctionObjArgs(py.describe, exc, NULL) : NULL;
                if (d && PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 2) {
                        o->error = py_to_utf8(PyTuple_GET_ITEM(d, 0), 4096, &l, &dummy);
                        if (PyUnicode_Check(PyTuple_GET_ITEM(d, 1))) {
                                PyObject *r = PyObject_CallMethod(err_cap, "write", "O", PyTuple_GET_ITEM(d, 1));

                                Py_XDECREF(r);
                        }
                }
                Py_XDECREF(d);
                PyErr_Clear();
                if (!o->error)
                        o->error = strdup(t && PyType_Check(t) ? ((PyTypeObject *) t)->tp_name : "exception");
                o->exit_code = 1;
        }

        Py_XDECREF(t);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        PyErr_Clear();
}

/* forkd's eval namespace: a new dict of builtins, numpy and np, per call */
static PyObject *fresh_globals(void) {
        PyObject *g = PyDict_New();

        if (!g)
                return NULL;
        if (PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) < 0 ||
            (py.numpy && (PyDict_SetItemString(g, "numpy", py.numpy) < 0 ||
                          PyDict_SetItemString(g, "np", py.numpy) < 0))) {
                Py_DECREF(g);
                return NULL;
        }
        return g;
}

static int py_run(const char *code, bool is_eval, bool fresh, unsigned timeout_secs, PyOutcome *o) {
        PyObject *out_cap = NULL, *err_cap = NULL, *old_out, *old_err, *co, *v = NULL, *rep = NULL, *g = NULL;
        int r = 0;

        PyEval_RestoreThread(py.ts);

        g = fresh ? fresh_globals() : (Py_INCREF(py.globals), py.globals);
        if (!g) {
                PyErr_Clear();
                r = -ENOMEM;
                goto finish;
        }

        out_cap = PyObject_CallFunction(py.capped, "n", (Py_ssize_t) AGENT_PY_OUTPUT_CAP);
        err_cap = PyObject_CallFunction(py.capped, "n", (Py_ssize_t) AGENT_PY_OUTPUT_CAP);
        if (!out_cap || !err_cap) {
                PyErr_Clear();
                r = -ENOMEM;
                goto finish;
        }

        old_out = PySys_GetObject("stdout"); /* borrowed; may be NULL if user code deleted it */
        old_err = PySys_GetObject("stderr");
        Py_XINCREF(old_out);
        Py_XINCREF(old_err);
        (void) PySys_SetObject("stdout", out_cap);
        (void) PySys_SetObject("stderr", err_cap);

        timer_arm(timeout_secs);
        co = Py_CompileString(code, is_eval ? "<eval>" : "<run_code>", is_eval ? Py_eval_input : Py_file_input);
        if (co) {
                v = PyEval_EvalCode(co, g, g);
                Py_DECREF(co);
        }
        if (v && is_eval)
                rep = PyObject_Repr(v);
        timer_disarm();

        if (!v || (is_eval && !rep))
                py_handle_exception(o, err_cap, timeout_secs);
        else if (rep) {
                o->result = py_to_utf8(rep, 4 * AGENT_PY_OUTPUT_CAP, &o->result_len, &o->truncated);
                if (!o->result)
                        o->result = strdup("<unrepresentable>");
                if (o->result)
                        o->result_len = strlen(o->result);
        }
        Py_XDECREF(v);
        Py_XDECREF(rep);

        /* run anything the signal machinery still holds, with the timer disarmed */
        if (PyErr_CheckSignals() < 0)
                PyErr_Clear();

        (void) PySys_SetObject("stdout", old_out);
        (void) PySys_SetObject("stderr", old_err);
        Py_XDECREF(old_out);
        Py_XDECREF(old_err);

        capture_take(out_cap, &o->out, &o->out_len, &o->truncated);
        capture_take(err_cap, &o->err, &o->err_len, &o->truncated);

finish:
        Py_XDECREF(g);
        Py_XDECREF(out_cap);
        Py_XDECREF(err_cap);
        PyErr_Clear();
        py.ts = PyEval_SaveThread();
        return r;
}

/* ---- requests ---- */

typedef struct CodeArgs {
        char *code;
        uint32_t timeout_secs;
} CodeArgs;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static int dispatch_code(struct json_object *v, void *field, const char **ret_error) {
        char **p = field;
        size_t n = (size_t) json_object_get_string_len(v);

        if (n > AGENT_CODE_MAX) {
                *ret_error = "code exceeds 256 KiB";
                return -E2BIG;
        }
        if (strlen(json_object_get_string(v)) != n) {
                *ret_error = "code contains NUL";
                return -EINVAL;
        }
        *p = strdup(json_object_get_string(v));
        return *p ? 0 : -ENOMEM;
}

static const struct json_dispatch code_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "code", JSON_KIND_STRING, dispatch_code, offsetof(CodeArgs, code), 0, JSON_MANDATORY },
        { "timeout_secs", JSON_KIND_UINT32, NULL, offsetof(CodeArgs, timeout_secs), 0, 0 },
        {}
};

static struct json_object *str_or_null(const char *s, size_t n) {
        return s ? json_string_sanitized(s, n) : NULL;
}

static struct json_object *py_reply(const PyOutcome *o, bool is_eval, size_t out_len, size_t err_len,
                                    size_t res_len, bool truncated) {
        struct json_object *j = json_object_new_object();

        if (!j)
                return NULL;
        if (is_eval)
                json_object_object_add(j, "result", str_or_null(o->result, res_len));
        json_object_object_add(j, "error", str_or_null(o->error, o->error ? strlen(o->error) : 0));
        json_object_object_add(j, "exit_code", json_object_new_int(o->exit_code));
        json_object_object_add(j, "stdout", json_string_sanitized(o->out ?: "", o->out ? out_len : 0));
        json_object_object_add(j, "stderr", json_string_sanitized(o->err ?: "", o->err ? err_len : 0));
        json_object_object_add(j, "truncated", json_object_new_boolean(truncated));
        json_object_object_add(j, "timed_out", json_object_new_boolean(o->timed_out));
        return j;
}

static int py_op(Agent *a, uint32_t id, struct json_object *req, bool is_eval, bool fresh) {
        CodeArgs args = { .timeout_secs = AGENT_TIMEOUT_DEFAULT_SECS };
        const char *field = NULL, *err = NULL;
        _cleanup_(py_outcome_done) PyOutcome o = {};
        size_t lens[3];
        bool truncated;
        int r;

        r = json_dispatch_full(req, code_table, JSON_REJECT_UNKNOWN, &args, &field, &err);
        _cleanup_free_ char *code = args.code;
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        if (args.timeout_secs < 1 || args.timeout_secs > AGENT_TIMEOUT_MAX_SECS)
                return agent_send_error(a, id, "bad argument 'timeout_secs': must be 1 .. 3600"), 0;
        if (!py.ready)
                return agent_send_error(a, id, "Python is not available in this guest"), 0;

        r = py_run(code, is_eval, fresh, args.timeout_secs, &o);
        if (getpid() != a->self_pid)
                _exit(o.exit_code); /* the code forked and this is the child: never a second agent */
        if (r < 0)
                return r;

        lens[0] = o.out_len;
        lens[1] = o.err_len;
        lens[2] = o.result_len;
        truncated = o.truncated;
        for (unsigned attempt = 0; attempt < 16; attempt++) {
                struct json_object *j = py_reply(&o, is_eval, lens[0], lens[1], lens[2], truncated);
                const char *src[3] = { o.out, o.err, o.result };
                size_t len, excess, big = 0;

                if (!j || !json_plain(j, &len)) {
                        json_object_put(j);
                        return -ENOMEM;
                }
                if (len + 64 <= AGENT_MAX_PAYLOAD)
                        return agent_send_json(a, FKA_RESPONSE, id, j);
                json_object_put(j);

                excess = len + 64 - AGENT_MAX_PAYLOAD + 16;
                for (unsigned k = 1; k < 3; k++)
                        if (lens[k] > lens[big])
                                big = k;
                lens[big] = lens[big] > excess ? utf8_prefix(src[big], lens[big] - excess) : 0;
                truncated = true;
        }
        return agent_send_error(a, id, "reply too large"), 0;
}

int agent_op_eval(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, true, false);
}

int agent_op_eval_fresh(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, true, true);
}

int agent_op_run_code(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, false, false);
}
