// compactor inspector: the conversation page's live update. Every 2 s it asks for the requests
// recorded since the newest one shown and puts them on top of the timeline. The page works
// without it (reload to see new requests).
(function () {
  "use strict";
  var timeline = document.getElementById("timeline");
  if (!timeline || !window.fetch) return;
  var status = document.getElementById("live-status");
  var poll = function () {
    var seen = timeline.getAttribute("data-seen") || "";
    fetch(timeline.getAttribute("data-live") + "?seen=" + encodeURIComponent(seen), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error(response.status);
        var newest = response.headers.get("x-newest");
        return response.text().then(function (rows) { return { rows: rows, newest: newest }; });
      })
      .then(function (update) {
        if (update.rows) {
          // Rows rendered (and escaped) by compactor itself.
          var holder = document.createElement("tbody");
          holder.innerHTML = update.rows;
          var rows = Array.prototype.slice.call(holder.children);
          for (var i = rows.length - 1; i >= 0; i--) {
            rows[i].classList.add("fresh");
            timeline.insertBefore(rows[i], timeline.firstChild);
          }
          if (status) status.textContent = "Live: " + rows.length + " new request(s); reload for the plots.";
        }
        if (update.newest) timeline.setAttribute("data-seen", update.newest);
      })
      .catch(function () { if (status) status.textContent = "Live updates paused."; })
      .then(function () { setTimeout(poll, 2000); });
  };
  if (status) status.textContent = "Live.";
  setTimeout(poll, 2000);
})();
