/*
 * agentcanvas embed page: a chat with one agent, for an iframe on another site.
 *
 * Plain JavaScript, no dependencies, no build step. It talks to the embed routes
 * (/api/v1/agentbots/<id>/...) with the page's embed token and this browser's
 * end-user id, a random 128-bit id kept in localStorage. The conversation's session
 * id is kept there too, so a reload shows the conversation again.
 *
 * Every text that comes from a person, the agent or the server is put into the page
 * with textContent, never as markup: a message holding <script> shows as text.
 */
(function () {
  "use strict";

  var app = document.getElementById("app");
  var agentId = app.getAttribute("data-agent-id");
  var token = app.getAttribute("data-token");
  var apiBase = app.getAttribute("data-api");
  var agentTitle = document.getElementById("title").textContent;

  var els = {
    messages: document.getElementById("messages"),
    status: document.getElementById("status"),
    composer: document.getElementById("composer"),
    input: document.getElementById("message"),
    send: document.getElementById("send"),
    stop: document.getElementById("stop"),
    newChat: document.getElementById("new-chat"),
    attach: document.getElementById("attach"),
    attachInput: document.getElementById("attach-input"),
    attachments: document.getElementById("attachments"),
  };

  var USER_KEY = "agentcanvas.user";
  var SESSION_KEY = "agentcanvas.session." + agentId;

  var state = {
    userId: null,
    sessionId: null,
    info: null, // GET /inputs: title, prologue, mode, inputs (Begin's form), max_value_bytes
    busy: false,
    stopping: false,
    openForm: null, // the form waiting for answers: {element, fields, submit}
  };
  var formCount = 0;

  // ------------------------------------------------------------------ storage
  // A browser that blocks storage in third-party frames still gets a working chat;
  // it only forgets the conversation on reload.
  var memoryStore = {};
  var storageWorks = true;

  function load(key) {
    try {
      return window.localStorage.getItem(key);
    } catch (e) {
      storageWorks = false;
      return Object.prototype.hasOwnProperty.call(memoryStore, key) ? memoryStore[key] : null;
    }
  }

  function store(key, value) {
    try {
      if (value === null) window.localStorage.removeItem(key);
      else window.localStorage.setItem(key, value);
    } catch (e) {
      storageWorks = false;
      if (value === null) delete memoryStore[key];
      else memoryStore[key] = value;
    }
  }

  function randomId() {
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return Array.prototype.map
      .call(bytes, function (b) {
        return ("0" + b.toString(16)).slice(-2);
      })
      .join("");
  }

  function endUserId() {
    var id = load(USER_KEY);
    if (!id || !/^[A-Za-z0-9_-]{32,128}$/.test(id)) {
      id = randomId();
      store(USER_KEY, id);
    }
    return id;
  }

  function rememberSession(id) {
    state.sessionId = id;
    store(SESSION_KEY, id);
  }

  function forgetSession() {
    state.sessionId = null;
    store(SESSION_KEY, null);
  }

  // ------------------------------------------------------------------ page parts
  function showStatus(text, kind) {
    els.status.textContent = text;
    els.status.className = "notice" + (kind ? " " + kind : "");
    els.status.hidden = !text;
  }

  function scrollToEnd() {
    els.messages.scrollTop = els.messages.scrollHeight;
  }

  function addMessage(role, text) {
    var item = document.createElement("article");
    item.className = "message " + role;
    var who = document.createElement("h2");
    who.className = "visually-hidden";
    who.textContent = role === "user" ? "You said" : agentTitle + " said";
    var bubble = document.createElement("div");
    bubble.className = "bubble";
    bubble.textContent = text || "";
    item.appendChild(who);
    item.appendChild(bubble);
    els.messages.appendChild(item);
    scrollToEnd();
    return { item: item, bubble: bubble };
  }

  function addNote(reply, text, kind) {
    var note = document.createElement("p");
    note.className = "note " + (kind || "");
    note.textContent = text;
    reply.item.appendChild(note);
    scrollToEnd();
    return note;
  }

  function setBusy(busy) {
    state.busy = busy;
    els.send.disabled = busy;
    els.stop.hidden = !busy;
    els.stop.disabled = false;
    els.stop.textContent = "Stop";
    els.newChat.disabled = busy;
    els.messages.setAttribute("aria-busy", busy ? "true" : "false");
    if (state.openForm) state.openForm.submit.disabled = busy;
    if (!busy) state.stopping = false;
  }

  // ------------------------------------------------------------------ HTTP
  function ChatError(kind, message, status, body) {
    this.kind = kind; // "network", "http"
    this.message = message;
    this.status = status || 0;
    this.body = body || null;
  }

  function request(method, path, body) {
    var headers = { Authorization: "Bearer " + token };
    var init = { method: method, headers: headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return window.fetch(apiBase + path, init).catch(function () {
      throw new ChatError(
        "network",
        "Could not reach the chat server. Check your internet connection and try again."
      );
    });
  }

  // The words a person sees for a failed call.
  function errorFrom(response) {
    return response
      .json()
      .catch(function () {
        return null;
      })
      .then(function (body) {
        var serverText = body && typeof body.message === "string" ? body.message : "";
        var code = body && body.code;
        var text;
        if (response.status === 401) {
          text = "This chat is not available any more: its access key was revoked or is not valid.";
        } else if (response.status === 409 && code === 106) {
          text =
            "The assistant is still answering your previous message. Wait until it has finished, then send again.";
        } else if (response.status === 409) {
          text = "The answer was stopped.";
        } else if (response.status === 413) {
          text = "That is too large to send. " + serverText;
        } else if (response.status === 404) {
          text = "This conversation is no longer available.";
        } else if (response.status >= 500) {
          text = "The server had a problem and could not answer" + (serverText ? ": " + serverText : ".") + " Please try again.";
        } else {
          text = serverText || "The request failed (HTTP " + response.status + ").";
        }
        return new ChatError("http", text, response.status, body);
      });
  }

  function getJSON(path) {
    return request("GET", path).then(function (response) {
      if (!response.ok) {
        return errorFrom(response).then(function (err) {
          throw err;
        });
      }
      return response.json().then(function (body) {
        return body.data;
      });
    });
  }

  // Reads "data:<json>" frames from a streamed reply; resolves true at [DONE],
  // false if the stream ended without it (the connection was lost).
  function readEvents(response, onEvent) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";

    function handleFrame(frame) {
      var lines = frame.split("\n");
      var data = [];
      for (var i = 0; i < lines.length; i++) {
        if (lines[i].indexOf("data:") === 0) data.push(lines[i].slice(5).replace(/^ /, ""));
      }
      if (!data.length) return false;
      var text = data.join("\n");
      if (text === "[DONE]") return true;
      onEvent(JSON.parse(text));
      return false;
    }

    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) return false;
        buffer += decoder.decode(chunk.value, { stream: true }).replace(/\r\n/g, "\n");
        var cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          var frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (handleFrame(frame)) return true;
        }
        return pump();
      });
    }

    return pump();
  }

  // ------------------------------------------------------------------ files
  // Files are uploaded as soon as they are chosen (POST /agentbots/<id>/upload, with
  // progress), then sent by id: with the message (the Attach button) or as a file
  // field's answer. The page refuses, in words, what the server would refuse anyway.
  function fileTypes() {
    return (state.info && state.info.file_types) || [];
  }

  function maxFileBytes() {
    return (state.info && state.info.max_file_bytes) || 32 * 1024 * 1024;
  }

  function acceptList() {
    return fileTypes()
      .map(function (ext) {
        return "." + ext;
      })
      .join(",");
  }

  function formatBytes(n) {
    if (n >= 1024 * 1024) return (n / (1024 * 1024)).toFixed(n % (1024 * 1024) ? 1 : 0) + " MB";
    if (n >= 1024) return Math.round(n / 1024) + " KB";
    return n + " bytes";
  }

  // Why the page will not upload this file, or "".
  function fileProblem(file) {
    var dot = file.name.lastIndexOf(".");
    var ext = dot >= 0 ? file.name.slice(dot + 1).toLowerCase() : "";
    var types = fileTypes();
    if (types.length && types.indexOf(ext) < 0) {
      return (
        file.name + " cannot be sent: " + (ext ? "." + ext + " files are" : "files without an extension are") +
        " not supported. Supported: " + types.join(", ") + "."
      );
    }
    if (file.size > maxFileBytes()) {
      return file.name + " is too large (" + formatBytes(file.size) + "): the limit is " + formatBytes(maxFileBytes()) + ".";
    }
    if (!file.size) return file.name + " is empty.";
    return "";
  }

  function isFileList(value) {
    return Array.isArray(value) && value.length > 0 && value.every(function (v) {
      return v && typeof v === "object" && typeof v.name === "string";
    });
  }

  function fileNames(value) {
    return isFileList(value)
      ? value
          .map(function (f) {
            return f.name;
          })
          .join(", ")
      : "";
  }

  function attachedLine(files) {
    return isFileList(files) ? "\nAttached: " + fileNames(files) : "";
  }

  function uploadError(status, body, file) {
    var serverText = body && typeof body.message === "string" ? body.message : "";
    if (status === 413) return file.name + " is too large to send. " + serverText;
    if (status === 401) return "This chat is not available any more: its access key was revoked or is not valid.";
    if (status === 0) return "Could not reach the chat server to upload " + file.name + ". Try again.";
    return serverText || "Uploading " + file.name + " failed (HTTP " + status + ").";
  }

  // Uploads one file; resolves to its descriptor, rejects with words for a person.
  function uploadFile(file, onProgress) {
    return new Promise(function (resolve, reject) {
      var xhr = new XMLHttpRequest();
      xhr.open("POST", apiBase + "/agentbots/" + encodeURIComponent(agentId) + "/upload");
      xhr.setRequestHeader("Authorization", "Bearer " + token);
      xhr.upload.onprogress = function (event) {
        if (event.lengthComputable) onProgress(event.loaded / event.total);
      };
      xhr.onload = function () {
        var body = null;
        try {
          body = JSON.parse(xhr.responseText);
        } catch (e) {
          body = null;
        }
        if (xhr.status === 200 && body && body.code === 0) {
          onProgress(1);
          resolve(Array.isArray(body.data) ? body.data[0] : body.data);
        } else {
          reject(uploadError(xhr.status, body, file));
        }
      };
      xhr.onerror = function () {
        reject(uploadError(0, null, file));
      };
      var data = new FormData();
      data.append("user_id", state.userId);
      data.append("file", file, file.name);
      xhr.send(data);
    });
  }

  // One file in a list: its name, upload progress, and a remove button.
  // Returns {item, promise, descriptor(), failed()}.
  function uploadItem(list, file, onRemove) {
    var item = document.createElement("li");
    item.className = "upload";
    var name = document.createElement("span");
    name.className = "upload-name";
    name.textContent = file.name;
    var bar = document.createElement("progress");
    bar.max = 100;
    bar.value = 0;
    bar.setAttribute("aria-label", "Uploading " + file.name);
    var note = document.createElement("span");
    note.className = "upload-note";
    note.setAttribute("aria-live", "polite");
    note.textContent = "uploading…";
    var remove = document.createElement("button");
    remove.type = "button";
    remove.className = "secondary remove";
    remove.textContent = "✕";
    remove.setAttribute("aria-label", "Remove " + file.name);
    item.appendChild(name);
    item.appendChild(bar);
    item.appendChild(note);
    item.appendChild(remove);
    list.appendChild(item);
    list.hidden = false;

    var entry = { item: item, descriptor: null, error: "" };
    remove.addEventListener("click", function () {
      item.remove();
      if (!list.children.length) list.hidden = true;
      onRemove(entry);
    });
    var problem = fileProblem(file);
    if (problem) {
      entry.error = problem;
      item.classList.add("failed");
      bar.remove();
      note.textContent = problem;
      entry.promise = Promise.resolve();
      return entry;
    }
    entry.promise = uploadFile(file, function (fraction) {
      bar.value = Math.round(fraction * 100);
      note.textContent = fraction < 1 ? Math.round(fraction * 100) + "%" : "processing…";
    }).then(
      function (descriptor) {
        entry.descriptor = descriptor;
        item.classList.add("done");
        bar.remove();
        note.textContent = formatBytes(file.size);
      },
      function (text) {
        entry.error = text;
        item.classList.add("failed");
        bar.remove();
        note.textContent = text;
      }
    );
    return entry;
  }

  // ---- the composer's Attach button
  var attached = [];

  function attachFiles(fileList) {
    Array.prototype.forEach.call(fileList, function (file) {
      attached.push(
        uploadItem(els.attachments, file, function (entry) {
          attached = attached.filter(function (e) {
            return e !== entry;
          });
          els.input.focus();
        })
      );
    });
    var failed = attached.filter(function (e) {
      return e.error;
    });
    if (failed.length) showStatus(failed[failed.length - 1].error, "error");
  }

  // {ready: descriptors uploaded, waiting: uploads not finished}
  function composerFiles() {
    return {
      ready: attached
        .filter(function (e) {
          return e.descriptor;
        })
        .map(function (e) {
          return e.descriptor;
        }),
      waiting: attached.some(function (e) {
        return !e.descriptor && !e.error;
      }),
    };
  }

  function clearAttachments() {
    attached = [];
    els.attachments.textContent = "";
    els.attachments.hidden = true;
  }

  // ---- a file field of a form: uploads as chosen, answers with the descriptors
  function fileFieldUploads(control, onChange) {
    var list = document.createElement("ul");
    list.className = "attachments in-form";
    list.setAttribute("aria-label", "Chosen files");
    list.hidden = true;
    var entries = [];
    control.addEventListener("change", function () {
      onChange();
      Array.prototype.forEach.call(control.files || [], function (file) {
        entries.push(
          uploadItem(list, file, function (entry) {
            entries = entries.filter(function (e) {
              return e !== entry;
            });
            control.value = ""; // the same file can be chosen again
            control.focus();
          })
        );
      });
    });
    return {
      list: list,
      ready: function () {
        return Promise.all(
          entries.map(function (e) {
            return e.promise;
          })
        );
      },
      read: function (required) {
        var failed = entries.filter(function (e) {
          return e.error;
        });
        if (failed.length) return { error: failed[0].error + " Remove it, or choose another file." };
        var done = entries
          .filter(function (e) {
            return e.descriptor;
          })
          .map(function (e) {
            return e.descriptor;
          });
        if (!done.length) return required ? { error: "Please choose a file." } : { skip: true };
        return { value: done };
      },
    };
  }

  // ------------------------------------------------------------------ forms
  var TYPE_HINTS = {
    integer: "A whole number, like 42.",
    float: "A number, like 3.5.",
    object: 'JSON, like {"key": "value"}.',
  };

  function byteLength(text) {
    return new TextEncoder().encode(text).length;
  }

  function maxBytes() {
    return (state.info && state.info.max_value_bytes) || 65536;
  }

  function hasDefault(def) {
    return def.value !== undefined && def.value !== null && def.value !== "";
  }

  // Builds one field: label, control, help and error line. Returns {read(), control, error}.
  function buildField(form, key, def, index) {
    var id = "f" + formCount + "-" + index;
    var type = def.type || "line";
    var wrap = document.createElement("div");
    wrap.className = "field field-" + type;

    var label = document.createElement("label");
    label.setAttribute("for", id);
    label.textContent = def.name || key;
    if (def.optional) {
      var opt = document.createElement("span");
      opt.className = "optional";
      opt.textContent = " (optional)";
      label.appendChild(opt);
    }

    var control;
    if (type === "paragraph" || type === "object") {
      control = document.createElement("textarea");
      control.rows = type === "object" ? 4 : 3;
      if (type === "object") {
        control.className = "code";
        control.spellcheck = false;
        if (hasDefault(def)) control.value = typeof def.value === "string" ? def.value : JSON.stringify(def.value, null, 2);
      } else if (hasDefault(def)) {
        control.value = String(def.value);
      }
    } else if (type === "options") {
      control = document.createElement("select");
      var options = Array.isArray(def.options) ? def.options : [];
      var blank = document.createElement("option");
      blank.value = "";
      blank.textContent = "Choose…";
      control.appendChild(blank);
      options.forEach(function (value, i) {
        var option = document.createElement("option");
        option.value = String(i);
        option.textContent = String(value);
        if (hasDefault(def) && value === def.value) option.selected = true;
        control.appendChild(option);
      });
      control._options = options;
    } else if (type === "boolean") {
      control = document.createElement("input");
      control.type = "checkbox";
      control.checked = def.value === true || def.value === "true";
    } else if (type === "file") {
      control = document.createElement("input");
      control.type = "file";
      control.multiple = true;
      control.accept = acceptList();
      var fileField = fileFieldUploads(control, function () {
        setFieldError({ error: error, control: control }, "");
      });
        } else {
      control = document.createElement("input");
      control.type = "text";
      if (type === "integer") control.inputMode = "numeric";
      if (type === "float") control.inputMode = "decimal";
      if (hasDefault(def)) control.value = String(def.value);
    }
    control.id = id;
    control.name = key;
    if (!def.optional && !hasDefault(def) && type !== "boolean") control.setAttribute("aria-required", "true");

    var helpText = def.description || def.tips || TYPE_HINTS[type] || "";
    var help = null;
    if (helpText) {
      help = document.createElement("p");
      help.className = "help";
      help.id = id + "-help";
      help.textContent = helpText;
    }
    var error = document.createElement("p");
    error.className = "field-error";
    error.id = id + "-error";
    error.hidden = true;
    control.setAttribute("aria-describedby", (help ? help.id + " " : "") + error.id);

    if (type === "boolean") {
      var row = document.createElement("div");
      row.className = "check";
      row.appendChild(control);
      row.appendChild(label);
      wrap.appendChild(row);
    } else {
      wrap.appendChild(label);
      wrap.appendChild(control);
      if (type === "file") wrap.appendChild(fileField.list);
    }
    if (help) wrap.appendChild(help);
    wrap.appendChild(error);
    form.appendChild(wrap);

    // The answer, or {error} when the browser can already tell it does not fit.
    function read() {
      var required = !def.optional && !hasDefault(def);
      if (type === "boolean") return { value: control.checked };
      if (type === "file") return fileField.read(required);
      if (type === "options") {
        if (control.value === "") return required ? { error: "Please choose one." } : { skip: true };
        var picked = control._options[Number(control.value)];
        return { value: picked === undefined ? control.value : picked };
      }
      var text = control.value;
      if (!text.trim()) return required ? { error: "Please fill in this field." } : { skip: true };
      if (byteLength(text) > maxBytes()) return { error: "This is too long: at most " + maxBytes() + " bytes." };
      if (type === "integer" && !/^\s*[+-]?\d+\s*$/.test(text)) {
        return { error: "Enter a whole number, like 42." };
      }
      if (type === "float") {
        var n = Number(text.trim());
        if (!/^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/.test(text) || !isFinite(n)) {
          return { error: "Enter a number, like 3.5." };
        }
      }
      if (type === "object") {
        try {
          JSON.parse(text);
        } catch (e) {
          return { error: "Enter valid JSON (" + e.message + ")." };
        }
      }
      return { value: type === "line" || type === "paragraph" || type === "object" ? text : text.trim() };
    }

    function display(value) {
      if (type === "file") return fileNames(value);
      if (type === "boolean") return value ? "yes" : "no";
      return String(value);
    }

    // Resolves once the field's answer can be read (a chosen file takes a moment).
    function ready() {
      return type === "file" ? fileField.ready() : Promise.resolve();
    }

    return { key: key, label: def.name || key, control: control, error: error, read: read, ready: ready, display: display };
  }

  // "Your age: 41", "Anything else? none" (no colon after a question mark).
  function answerLine(label, value) {
    return label + (/[?:]$/.test(label) ? " " : ": ") + value;
  }

  function setFieldError(field, text) {
    field.error.textContent = text || "";
    field.error.hidden = !text;
    if (text) field.control.setAttribute("aria-invalid", "true");
    else field.control.removeAttribute("aria-invalid");
  }

  // Renders a form (Begin's, or a paused run's user_inputs) after `anchor`.
  // `onAnswers(inputs, summary, form)` sends it and resolves to the field errors, if any.
  function renderForm(anchor, fields, legendText, onAnswers) {
    formCount += 1;
    var form = document.createElement("form");
    form.className = "user-form";
    form.noValidate = true;
    var fieldset = document.createElement("fieldset");
    var legend = document.createElement("legend");
    legend.textContent = legendText;
    fieldset.appendChild(legend);
    form.appendChild(fieldset);
    var summary = document.createElement("p");
    summary.className = "form-error";
    summary.setAttribute("role", "alert");
    summary.hidden = true;

    var built = Object.keys(fields).map(function (key, i) {
      return buildField(fieldset, key, fields[key] || {}, i);
    });
    fieldset.appendChild(summary);
    var submit = document.createElement("button");
    submit.type = "submit";
    submit.textContent = "Send answers";
    fieldset.appendChild(submit);
    anchor.appendChild(form);

    var handle = { element: form, fields: built, submit: submit };
    state.openForm = handle;
    submit.disabled = state.busy;

    function showErrors(errors, message) {
      var first = null;
      built.forEach(function (field) {
        var text = errors[field.key] || "";
        setFieldError(field, text);
        if (text && !first) first = field;
      });
      var unknown = Object.keys(errors).filter(function (k) {
        return !built.some(function (f) {
          return f.key === k;
        });
      });
      var extra = unknown
        .map(function (k) {
          return k + ": " + errors[k];
        })
        .join(" ");
      var text = message || (first || extra ? "Please correct the fields marked below." : "");
      summary.textContent = text + (extra ? " " + extra : "");
      summary.hidden = !summary.textContent;
      if (first) first.control.focus();
    }

    form.addEventListener("submit", function (event) {
      event.preventDefault();
      if (state.busy) return;
      Promise.all(
        built.map(function (field) {
          return field.ready();
        })
      ).then(sendAnswers);
    });

    function sendAnswers() {
      if (state.busy) return;
      var inputs = {};
      var lines = [];
      var errors = {};
      built.forEach(function (field) {
        var answer = field.read();
        if (answer.error) errors[field.key] = answer.error;
        else if (!answer.skip) {
          inputs[field.key] = answer.value;
          lines.push(answerLine(field.label, field.display(answer.value)));
        }
      });
      if (Object.keys(errors).length) {
        showErrors(errors);
        return;
      }
      showErrors({});
      onAnswers(inputs, lines.join("\n"), handle).then(function (result) {
        if (result && result.errors) {
          showErrors(result.errors, result.message);
        } else if (result && result.sent) {
          fieldset.disabled = true;
          form.classList.add("answered");
          if (state.openForm === handle) state.openForm = null;
        }
      });
    }
    return handle;
  }

  // ------------------------------------------------------------------ turns
  // Sends one turn and streams its answer. Resolves to {sent: true} once the
  // server took it, or {errors, message} when a form's answers were refused.
  function runTurn(payload, userText) {
    if (state.busy) return Promise.resolve(null);
    setBusy(true);
    showStatus("");
    var body = { user_id: state.userId, stream: true };
    Object.keys(payload).forEach(function (k) {
      body[k] = payload[k];
    });
    if (state.sessionId) body.session_id = state.sessionId;

    return request("POST", "/agentbots/" + encodeURIComponent(agentId) + "/completions", body)
      .then(function (response) {
        if (!response.ok) {
          return errorFrom(response).then(function (err) {
            throw err;
          });
        }
        var sid = response.headers.get("X-Session-Id");
        if (sid) rememberSession(sid);
        if (userText) addMessage("user", userText);
        var reply = addMessage("assistant", "");
        reply.item.classList.add("streaming");
        streamInto(response, reply);
        return { sent: true };
      })
      .catch(function (err) {
        setBusy(false);
        return failedToSend(err);
      });
  }

  function failedToSend(err) {
    if (!(err instanceof ChatError)) throw err;
    var data = err.body && err.body.data;
    if (err.status === 400 && data && data.errors) {
      return { errors: data.errors, message: "The answers were not accepted: please correct the fields marked below." };
    }
    if (err.status === 404 && state.sessionId) {
      forgetSession();
      showStatus("Your previous conversation is no longer available. Send your message again to start a new one.", "error");
      return null;
    }
    showStatus(err.message, "error");
    return null;
  }

  function streamInto(response, reply) {
    var ended = false;
    readEvents(response, function (event) {
      ended = handleEvent(event, reply) || ended;
    })
      .then(function (done) {
        if (!done && !ended) {
          addNote(
            reply,
            "The connection was lost while the answer was coming. Reload the page in a moment to see the whole answer.",
            "error"
          );
        }
      })
      .catch(function () {
        addNote(
          reply,
          "The connection was lost while the answer was coming. Reload the page in a moment to see the whole answer.",
          "error"
        );
      })
      .then(function () {
        reply.item.classList.remove("streaming");
        setBusy(false);
        if (!state.openForm) els.input.focus();
        offerRegenerate(reply);
      });
  }

  // ------------------------------------------------------------------ regenerate
  // The last answer can be asked for again: the server takes that turn back (its
  // messages stay in its log, marked) and runs it again from the state before it.
  var regenerateButton = null;

  function offerRegenerate(reply) {
    if (regenerateButton) regenerateButton.remove();
    regenerateButton = null;
    // Not for a form waiting for answers, nor for a failed or stopped answer (it has a note).
    if (!reply || !state.sessionId || state.openForm || reply.item.querySelector(".note")) return;
    var button = document.createElement("button");
    button.type = "button";
    button.className = "secondary regenerate";
    button.textContent = "Regenerate";
    button.title = "Ask for this answer again";
    reply.item.appendChild(button);
    regenerateButton = button;
    button.addEventListener("click", function () {
      if (state.busy) return;
      setBusy(true);
      showStatus("");
      var path =
        "/agentbots/" + encodeURIComponent(agentId) + "/sessions/" + encodeURIComponent(state.sessionId) + "/regenerate";
      request("POST", path, { user_id: state.userId, stream: true })
        .then(function (response) {
          if (!response.ok) {
            return errorFrom(response).then(function (err) {
              throw err;
            });
          }
          button.remove();
          regenerateButton = null;
          reply.bubble.textContent = "";
          reply.item.classList.add("streaming");
          streamInto(response, reply);
        })
        .catch(function (err) {
          setBusy(false);
          failedToSend(err);
        });
    });
  }

  function appendText(reply, text) {
    if (!text) return;
    reply.bubble.textContent += text;
    scrollToEnd();
  }

  // One streamed event; returns true when it ended the turn.
  function handleEvent(event, reply) {
    var data = event.data || {};
    if (event.session_id && event.session_id !== state.sessionId) rememberSession(event.session_id);
    if (event.event === "message") {
      appendText(reply, data.content);
      return false;
    }
    if (event.event === "message_end") {
      if (!reply.bubble.textContent && data.content) appendText(reply, data.content);
      showSources(reply, data.reference || event.reference);
      return true;
    }
    if (event.event === "user_inputs") {
      var tips = data.tips || data.content || "";
      if (tips) appendText(reply, (reply.bubble.textContent ? "\n\n" : "") + tips);
      var handle = showPendingForm(reply.item, data.inputs || {});
      if (handle && handle.fields.length) {
        window.setTimeout(function () {
          handle.fields[0].control.focus();
        }, 0);
      }
      return true;
    }
    if (event.event === "workflow_finished") {
      var status = data.status;
      if (status === "cancelled") addNote(reply, "Stopped. This answer is not kept in the conversation.", "muted");
      else if (status && status !== "succeeded") {
        addNote(reply, data.content || data.error || "Sorry, the assistant could not answer. Please try again.", "error");
      }
      return true;
    }
    return false;
  }

  // ------------------------------------------------------------------ sources
  // The chunks an answer cites ([ID:n] markers) come with message_end as its
  // reference: listed under the answer, the document's name and the cited passage.
  var SOURCE_EXCERPT_CHARS = 240;

  function showSources(reply, reference) {
    var old = reply.item.querySelector(".sources");
    if (old) old.remove();
    var chunks = (reference && reference.chunks) || [];
    if (!chunks.length) return;
    var box = document.createElement("details");
    box.className = "sources";
    var summary = document.createElement("summary");
    summary.textContent = chunks.length === 1 ? "1 source" : chunks.length + " sources";
    box.appendChild(summary);
    var list = document.createElement("ol");
    chunks.forEach(function (chunk) {
      var item = document.createElement("li");
      var name = document.createElement("strong");
      name.textContent = chunk.document_name || chunk.docnm_kwd || "Document";
      var excerpt = document.createElement("span");
      var text = String(chunk.content || "").replace(/\s+/g, " ").trim();
      if (text.length > SOURCE_EXCERPT_CHARS) text = text.slice(0, SOURCE_EXCERPT_CHARS - 1) + "…";
      excerpt.textContent = text;
      item.appendChild(name);
      item.appendChild(document.createTextNode(": "));
      item.appendChild(excerpt);
      list.appendChild(item);
    });
    box.appendChild(list);
    reply.item.appendChild(box);
    scrollToEnd();
  }

  function showPendingForm(anchor, fields) {
    if (!Object.keys(fields).length) return null;
    return renderForm(anchor, fields, "Your answers", function (inputs, summary) {
      return runTurn({ inputs: inputs }, summary || "(answers sent)");
    });
  }

  function sendMessage() {
    var text = els.input.value;
    var files = composerFiles();
    if ((!text.trim() && !files.ready.length) || state.busy) return;
    if (files.waiting) {
      showStatus("Your files are still uploading: send when they are done.", "error");
      return;
    }
    if (byteLength(text) > maxBytes()) {
      showStatus("Your message is too long: at most " + maxBytes() + " bytes.", "error");
      return;
    }
    var payload = { question: text };
    if (files.ready.length) payload.files = files.ready;
    runTurn(payload, text + attachedLine(files.ready)).then(function (result) {
      if (result && result.sent) {
        els.input.value = "";
        clearAttachments();
      } else if (result && result.errors) {
        showStatus(result.errors.files ? "A file was not accepted: " + result.errors.files : result.message, "error");
      }
    });
  }

  function stopTurn() {
    if (!state.busy || state.stopping || !state.sessionId) return;
    state.stopping = true;
    els.stop.disabled = true;
    els.stop.textContent = "Stopping…";
    var path =
      "/agentbots/" + encodeURIComponent(agentId) + "/sessions/" + encodeURIComponent(state.sessionId) + "/cancel";
    request("POST", path, { user_id: state.userId })
      .then(function (response) {
        if (!response.ok) {
          return errorFrom(response).then(function (err) {
            throw err;
          });
        }
      })
      .catch(function (err) {
        state.stopping = false;
        els.stop.disabled = false;
        els.stop.textContent = "Stop";
        showStatus("Could not stop the answer: " + err.message, "error");
      });
  }

  // ------------------------------------------------------------------ start
  function startFresh() {
    els.messages.textContent = "";
    state.openForm = null;
    var info = state.info;
    var greeting = info.prologue ? addMessage("assistant", info.prologue) : null;
    var begin = info.inputs || {};
    if (info.mode === "task" && Object.keys(begin).length) {
      var anchor = greeting ? greeting.item : addMessage("assistant", "").item;
      renderForm(anchor, begin, "Start", function (inputs, summary) {
        return runTurn({ inputs: inputs, question: "" }, summary || "(started)");
      });
    }
  }

  function userTextOf(message, lastForm) {
    if (message.content) return message.content + attachedLine(message.files);
    if (isFileList(message.files)) return attachedLine(message.files).trim();
    var inputs = message.inputs || {};
    return Object.keys(inputs)
      .map(function (key) {
        var def = (lastForm && lastForm[key]) || {};
        var value = inputs[key];
        var shown = isFileList(value)
          ? fileNames(value)
          : value && typeof value === "object" ? value.name || JSON.stringify(value) : String(value);
        return answerLine(def.name || key, shown);
      })
      .join("\n");
  }

  // ------------------------------------------------------------------ transcript pages
  // The server answers a conversation a page at a time, the most recent first: a reload
  // shows the last page, and older pages come one by one on request.
  function sessionPath(sessionId) {
    return (
      "/agentbots/" + encodeURIComponent(agentId) + "/sessions/" + encodeURIComponent(sessionId) +
      "?user_id=" + encodeURIComponent(state.userId)
    );
  }

  function offerEarlier(sessionId, page, shown, total) {
    if (!total || shown >= total) return;
    var button = document.createElement("button");
    button.type = "button";
    button.className = "secondary earlier";
    button.textContent = "Show earlier messages";
    els.messages.insertBefore(button, els.messages.firstChild);
    button.addEventListener("click", function () {
      button.disabled = true;
      getJSON(sessionPath(sessionId) + "&messages_page=" + (page + 1)).then(
        function (older) {
          var first = button.nextSibling;
          button.remove();
          var lastForm = state.info.inputs || {};
          var messages = older.message || [];
          messages.forEach(function (m) {
            var text = m.role === "user" ? userTextOf(m, lastForm) : m.content;
            if (m.form) lastForm = m.form;
            if (text) els.messages.insertBefore(addMessage(m.role === "user" ? "user" : "assistant", text).item, first);
          });
          els.messages.scrollTop = 0;
          offerEarlier(sessionId, page + 1, shown + messages.length, older.messages_total);
        },
        function (err) {
          button.disabled = false;
          showStatus(err instanceof ChatError ? err.message : "Earlier messages could not be loaded.", "error");
        }
      );
    });
  }

  // Shows the stored conversation again; false when there is none to show.
  function restore(sessionId) {
    var path = sessionPath(sessionId);
    return getJSON(path).then(
      function (session) {
        els.messages.textContent = "";
        state.openForm = null;
        state.sessionId = session.id;
        var lastForm = state.info.inputs || {};
        var lastItem = null;
        (session.message || []).forEach(function (m) {
          if (m.role === "user") {
            var text = userTextOf(m, lastForm);
            if (text) addMessage("user", text);
          } else {
            var shown = addMessage("assistant", m.content);
            lastItem = shown.item;
            if (m.reference) showSources(shown, { chunks: m.reference });
            if (m.form) lastForm = m.form;
          }
        });
        if (session.form && lastItem) showPendingForm(lastItem, session.form.inputs || {});
        var last = (session.message || [])[(session.message || []).length - 1];
        if (lastItem && last && last.round > 0 && session.status === "idle") {
          offerRegenerate({ item: lastItem, bubble: lastItem.querySelector(".bubble") });
        }
        offerEarlier(session.id, 1, (session.message || []).length, session.messages_total);
        if (session.status === "running") {
          showStatus("An answer is still being written; it will appear here when it is done.");
          window.setTimeout(function () {
            // Not while a turn of this page streams: that would redraw its answer away.
            if (state.busy || state.sessionId !== session.id) return;
            restore(session.id).then(function () {}, function () {});
          }, 2000);
        } else {
          showStatus("");
        }
        return true;
      },
      function (err) {
        if (err.status === 404) {
          forgetSession();
          showStatus("Your previous conversation is no longer available; this is a new one.");
          return false;
        }
        throw err;
      }
    );
  }

  function start() {
    state.userId = endUserId();
    setBusy(false);
    getJSON("/agentbots/" + encodeURIComponent(agentId) + "/inputs")
      .then(function (info) {
        state.info = info;
        var saved = load(SESSION_KEY);
        return saved ? restore(saved) : false;
      })
      .then(function (restored) {
        if (!restored) startFresh();
        if (!storageWorks) {
          showStatus("This browser does not let the chat remember the conversation; it is lost on reload.");
        }
      })
      .catch(function (err) {
        showStatus(err instanceof ChatError ? err.message : "The chat could not start: " + err, "error");
      });
  }

  els.composer.addEventListener("submit", function (event) {
    event.preventDefault();
    sendMessage();
  });
  els.input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendMessage();
    } else if (event.key === "Escape" && state.busy) {
      stopTurn();
    }
  });
  els.stop.addEventListener("click", stopTurn);
  els.attach.addEventListener("click", function () {
    els.attachInput.accept = acceptList();
    els.attachInput.click();
  });
  els.attachInput.addEventListener("change", function () {
    attachFiles(els.attachInput.files || []);
    els.attachInput.value = "";
  });
  els.newChat.addEventListener("click", function () {
    if (state.busy || !state.info) return;
    forgetSession();
    showStatus("");
    clearAttachments();
    startFresh();
    els.input.focus();
  });
  window.addEventListener("offline", function () {
    showStatus("You are offline. Messages cannot be sent until the connection is back.", "error");
  });
  window.addEventListener("online", function () {
    showStatus("");
  });
  window.addEventListener("error", function (event) {
    showStatus("Something went wrong in this page (" + event.message + "). Reload it to continue.", "error");
  });
  window.addEventListener("unhandledrejection", function (event) {
    var reason = event.reason;
    showStatus(
      reason instanceof ChatError ? reason.message : "Something went wrong in this page. Reload it to continue.",
      "error"
    );
  });

  start();
})();
