"""The Chat tab's layout: the conversation list (new, search, title, delete and undo, export), the chat with its
message box and buttons, and the live panel with the system prompt. Components only: ChatView (chat_view.py) and
ConversationsView hold the handlers, SpecChatUI (app.py) builds the page."""
from __future__ import annotations

import gradio as gr

from ..chat.settings import Settings
from . import draft_colours, render


CHAT_HEIGHT = "calc(100dvh - 400px)"  # 400 px: what the page holds above and below the chat


class ChatTab:
    """The tab's components, made where it is constructed (inside the Chat tab), with ``s``'s defaults."""

    def __init__(self, s: Settings):
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=220, elem_id="conversations"):
                self._conversation_list()
            with gr.Column(scale=3):
                self._chat(s)
            with gr.Column(scale=1, min_width=300):
                self.live = gr.HTML(render.live_panel(None, [], "idle"), elem_id="live-stats")
                self.system = gr.Textbox(s.system_prompt, label="System prompt", lines=2, elem_id="system")

    def _conversation_list(self) -> None:
        self.new_chat = gr.Button("+ New chat", size="sm", elem_id="new-chat")
        # (hidden names still name the fields for a screen reader: Gradio's own default is "Textbox")
        self.search = gr.Textbox(label="Search chats", show_label=False, placeholder="Search chats…", lines=1,
                                 max_lines=1, elem_id="conv-search")
        self.conv_list = gr.Radio([], label="Chats", show_label=False, elem_id="conv-list")
        self.title = gr.Textbox(label="Title (Enter renames)", lines=1, max_lines=1, elem_id="conv-title")
        with gr.Row():
            self.delete = gr.Button("Delete", size="sm", variant="stop", elem_id="conv-delete")
            self.undo = gr.Button("Undo", size="sm", visible=False, elem_id="conv-undo")
            self.export = gr.Button("Export", size="sm", elem_id="conv-export")
        self.exported = gr.File(label="Markdown and JSON", file_count="multiple", visible=False, interactive=False,
                                elem_id="conv-files")

    def _chat(self, s: Settings) -> None:
        # As tall as the window leaves room for: the header, tabs, message box and buttons stay in sight on a
        # 1366x768 laptop screen (a fixed 560 px opened the page scrolled past them) and a tall screen is used.
        # editable="user": a sent message's pencil edits it, and the answer is made again from there. Each message
        # part is a row of its own (group_consecutive_messages=False): grouped, Gradio 6.31's edit of a message with
        # images fails in the page (its Submit slices the image part as text) and nothing reaches the server.
        # No "Copy conversation": Gradio's copies each message's HTML and figures; Export gives the chat as Markdown.
        self.chatbot = gr.Chatbot(elem_id="chat", height=CHAT_HEIGHT, min_height=240, show_label=False,
                                  buttons=["copy"], editable="user", group_consecutive_messages=False,
                                  feedback_options=None, placeholder="Ask anything. Tokens the draft model got right "
                                                                     "are counted live on the right.")
        self.notice = gr.HTML(elem_id="notice")
        with gr.Row():
            # lines=1 with room to grow: Enter sends, Shift+Enter starts a new line. Images: the attach button,
            # paste or drop, several per message (any length of text stays text, never turned into a file).
            self.msg = gr.MultimodalTextbox(
                show_label=False, placeholder="Message SpecChat… (Enter sends, Shift+Enter for a new line; paste "
                "or drop images)", lines=1, max_lines=12, scale=6, elem_id="msg", autofocus=True,
                file_types=["image"], file_count="multiple", sources=["upload"], submit_btn=False,
                max_plain_text_length=10**9)
            with gr.Column(scale=1, min_width=110):
                self.send = gr.Button("Send", variant="primary", elem_id="send")
                self.stop = gr.Button("Stop", variant="stop", elem_id="stop")
        self.images = gr.HTML(elem_id="image-note")  # whether the loaded model takes images, in words
        with gr.Row():  # the legend takes the room the two controls leave: in a third of it, it ran to 7 lines
            self.regen = gr.Button("Regenerate", size="sm", elem_id="regen", scale=0, min_width=130)
            self.go_on = gr.Button("Continue", size="sm", elem_id="continue", scale=0, min_width=110)
            self.show_draft = gr.Checkbox(s.show_draft_tokens, label="Colour draft tokens", elem_id="show-draft",
                                          scale=0, min_width=200)
            gr.HTML(draft_colours.legend(), elem_id="draft-legend", scale=1)
